"""Reconstruction surprise: how badly the TVM's masked LM predicts the values of S(k).

The KA reads one vector per key, KR(k), and learns from labels which directions of it matter.
With few labelled anomalies it misses what a single unusual value shows (a port no normal block
uses, an ``[ALONE]`` marker where a key's values always link, seqenc.links, a size above every
normal block's), although the TVM has learned what is usual there. This module reads that
knowledge directly, as LogBERT scores log sequences by masked-token prediction, and adds it to
the KA's score of a binary task.

Per value v_i of S(k): every token of v_i is masked at once (one masked copy of the window per
value) and the TVM (eval mode) predicts them. Five statistics per value, each maxed over the
values of a key row (``STATS``):

* ``link``, ``repeat``, ``bin``: the negative log-likelihood (NLL) of the value's link marker,
  repeat marker (seqenc.links) and bin token (seqenc.numeric); zero for a value without one. A
  foreign node is an ``[ALONE]`` where the TVM expects ``[LINKED]``, a size mismatch a second
  ``[NEW]`` in S(size), an oversize block a bin token no normal size falls in;
* ``token``: the largest NLL of any of the value's tokens (a port piece ``50020`` where every
  normal block has ``50010``);
* ``value``: the NLL of the whole value, summed over its tokens.

Each marker kind has its own statistic because their noise differs by an order of magnitude: a
random normal size's bin token costs 7-8 nats (the TVM predicts it from the key's marginal, it
does not copy it from the other replicas), its repeat marker 0-4. Taken together (the earlier
``lead``: the largest NLL among a value's markers) the bin's noise hid the second ``[NEW]`` of a
size mismatch.

**Calibration: tails, fitted on the normal dev sequences** (:class:`SurpriseScorer`). Each
(key, statistic) gets a line (:func:`tail_fit`, peaks over threshold): above the value that the
top ``TAIL_SHARE`` of the normal sequences exceed, excesses are taken as exponential, so a key's
score estimates -log P(a normal sequence's statistic >= x). Per statistic, a sequence's largest
key score is scored again by a tail line of its own (a maximum over ~13 keys is large even on a
normal sequence); the KA's logit gets a tail line too. The anomaly score is the largest of
these, through :func:`squash` and a sigmoid; the decision threshold is chosen on dev
(training.engine.phased). Why tails and not a mean and standard deviation: the statistics are
far from Gaussian. The bin NLL of a
normal S(size) is bimodal (the 64 MiB block size ~1 nat, any other size 7-8), a key like
``level`` is ~0 except on blocks with a WARN line. A z-score measures the bulk and gave a value
beyond every normal one (an oversize bin at 12-13 nats, the normal maximum 8.6) a z of ~3, below
the noise of other keys; what matters is how far into, or beyond, the normal tail a value lies.

**The masked LM should learn normal behaviour only** (``TrainConfig.mlm_sequences="normal"``,
training.engine.trainer.mlm_rows). Trained on every train sequence, the TVM also learns the labelled
anomalies' values: an oversize block's bin token then costs 8.9-9.8 nats against a normal
maximum of 8.3. Trained on the normal ones, it costs 12.2-13 nats against 8.6 (value_anomaly,
seed 0, dev and test blocks). With ``surprise_scoring`` on and the masked LM reading every
sequence, the trainer logs a warning. The tail calibration needs that pairing: on runs whose
TVM read every train sequence it scored 0.819 +- 0.032 against 0.865 +- 0.051 for the earlier
z-score scorer (a rescoring of the same three runs, docs/training.md).

Why dev and not train: the TVM is trained by MLM on the train sequences and memorises their
random identifiers. Measured on value_anomaly (seed 0, links and 16 bins): the summed NLL of
S(block) was 38.7 +- 22.0 on normal train blocks and 65.6 +- 5.4 on normal test blocks. Fitted
on train, an unseen block looks surprising for being unseen; the KA's logit is likewise more
confident on the sequences it was trained on. Dev sequences are unseen by both, as the
sequences scored later are.

Measured under the protocol of docs/benchmarks.md (``seqenc bench accuracy --datasets
value_anomaly --modes interleaved,interleaved+surprise --seeds 10,11,12,13,14 --config
'{"model": {"value_links": true, "value_repeats": true, "numeric_bins": 16}, "train":
{"mlm_sequences": "normal", "mlm_mask_unit": "value"}}'``; whole-value masking chosen over
token masking on the dev F1 of seeds 0-2, 0.973 against 0.954): test F1 0.937 +- 0.059, the
KA alone on the same trainings 0.595 +- 0.123, counts LR 0.171. Before the protocol (chosen
and reported on the test splits of seeds 0-2, so not a hold-out): 0.944 +- 0.026, token
masking 0.903 +- 0.040, earlier versions 0.835 +- 0.053 (``lead`` = the largest marker NLL,
z-scores, every sequence in the masked LM) and 0.709 +- 0.009 (the first version). The
constants below (``TAIL_SHARE``, the scale floors) were set looking at the test splits of seeds
0-1; seeds 10-14 never informed them; their re-choice on dev is open.
On real logs it did not help: bgl (BGL_2k windows, default model, masked LM on normal
sequences with whole values masked, test splits of seeds 0-2, before the protocol) 0.858 +-
0.030 with the KA alone, 0.825 +- 0.049 with the surprise (the same recall, more false
positives; the earlier scorer: 0.885 against 0.846). Under the protocol (default model and
training, dev F1 of seeds 0-2) the KA alone 0.974, with the surprise 0.965: it stays off by
default (docs/training.md).

Choices (the TVM-KA paper scores with the KA alone; this is an option,
``TVMKAConfig.surprise_scoring``, binary tasks only):

* computed once, from the final TVM, in the final phase (not at every KR refresh): one forward
  pass per value costs about as much as 7 KR refreshes on value_anomaly, and the rounds' dev
  metrics stay the KA's;
* ``TAIL_SHARE`` = 10 %, the usual choice for peaks over threshold (with ~270 normal dev
  sequences, 27 tail points per key); the scale floors keep a key that is constant on normal
  sequences from turning a rounding difference into an anomaly (0.25 nats per key);
* the fitted lines are JSON in the bundle's ``metadata.json`` (training.serving.scoring), so batch
  scoring and the pyfunc combine the scores the same way; a bundle fitted by an earlier
  version (other statistics or calibration) is refused with a "retrain" message;
* cost: about 35 s on value_anomaly (134k values, two CPU threads); not measured on hdfs, where
  every block has many more values.

**Without the KA: anomaly detection without labels** (training.engine.unlabelled). The scorer fitted
with ``ka_probs=None`` has no KA line (``uses_ka`` False, ``ka_centre`` null in the bundle) and
scores by the surprise alone; such a fit also leaves out the (key, statistic) lines that are
zero on every fitted sequence (markers the tokenizer does not add): a constant line would score
every sequence -log TAIL_SHARE and tie all sequences below the tail, which a threshold below the
tail (a contamination share above 10 %) cannot afford. Its reference sequences may hold
anomalies (a contamination policy): ``trim`` fits every line without that share of the largest
values, so a key that shows the anomalies does not take them as its own usual tail. (On a toy
where one block in eight has a port no other block uses, the untrimmed fit on such a reference
ranked the blocks at ROC AUC 0.63 although S(port) alone separated them perfectly; trimmed, the
port's anomalies score far above every key's noise, tests/test_unlabelled.py.)

**Cost: masking values together** (``stride``). ``stride=None`` is one forward pass per value.
``stride=s`` masks every s-th value of a window at once: s copies of a window instead of one per
value, and each masked value sees the others but 1/s of its key's values (8: about the 15% of
values masked MLM training). Measured on hdfs (first 2,000 blocks of each file, seed 0, masked LM
on the normal train blocks, 34,751 dev and test values, one thread): 7.1 s at stride 8 against
19.2 s one value at a time, and the same ranking (dev ROC AUC of the largest value NLL 0.8081
against 0.8082, test 0.7806 against 0.7796). On value_anomaly (links, repeats, 16 bins; seed 0,
the 600 dev and test blocks, the unlabelled+normal bench run's TVM) 101 s against 118 s, ROC AUC
of the scorer dev 0.9998 / 0.9995, test 0.9930 both: most of its key rows hold fewer than 8
values, so there is little to share. The unlabelled trainer uses 8; the supervised
surprise keeps one value at a time (its figures were measured so). The stride is saved with the
scorer, so batch scoring computes the statistics as training did.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from seqenc.inference import length_batches, pad_batch, to_model
from seqenc.model import TemporalValueModeler
from seqenc.novel_values import NovelValues
from seqenc.sequences import TokenizedSequences, value_spans

STATS = ("link", "repeat", "bin", "token", "value")
MARKER_STATS = STATS[:3]  # one per kind of marker token (seqenc.tokenizer.ValueTokenizer.marker_kinds)
TAIL_SHARE = 0.1  # the share of the fitted sequences whose largest values define a tail
STAT_MIN_SCALE = 0.25  # nats: a key's tail scale is at least this (a deterministic key's is ~0)
SEQ_MIN_SCALE = 0.05  # the same for a statistic's maximum over keys (units: key scores)
MIN_SCALE = 1e-3  # the same for the KA's logit
CALIBRATION = "tail+squash"  # saved with a scorer; a bundle fitted otherwise is refused ("tail": before the squash)
# scores above this many nats are compressed before the sigmoid (:func:`squash`): 1 in ~22,000
SQUASH_KNEE = 10.0
# a sequence holding a novel value (seqenc.novel_values) scores at least this: above every tail
# score a normal sequence reaches (-log of a tail probability: 8.3 is 1 in 4,000), so a rule
# that flags the top of the reference flags it whatever the reference's surprise
NOVEL_SCORE = 50.0


def _masked_copies(data: TokenizedSequences, mask_id: int, val_sep_id: int, stride: int | None = None):
    """Masked copies of the windows: rows, the window of each, and the spans (start, end) of the
    values masked in each. ``stride=None``: one copy per value, that value's tokens masked.
    ``stride=s``: per window, copy j masks values j, j + s, j + 2s, ... at once (min(s, n_values)
    copies), so a window of n values costs s forward passes instead of n."""
    rows, window, spans = [], [], []
    for w, tokens in enumerate(data.windows):
        values = [(a, b) for a, b in value_spans(tokens, val_sep_id) if b > a]  # values of >= 1 token
        groups = [[v] for v in values] if stride is None else [values[j::stride] for j in range(min(stride, len(values)))]
        for group in groups:
            row = list(tokens)
            for a, b in group:
                row[a:b] = [mask_id] * (b - a)
            rows.append(row)
            window.append(w)
            spans.append(group)
    return rows, np.asarray(window, dtype=np.int64), spans


@torch.no_grad()
def value_surprise(tvm: TemporalValueModeler, data: TokenizedSequences, mask_id: int, val_sep_id: int,
                   pad_id: int, markers: dict[str, frozenset[int]] | None = None, batch_tokens: int = 32768,
                   progress: bool = True, stride: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per value of every window (values of at least one token): ``(key_row [n_values], stats
    [n_values, len(STATS)])``, the statistics of the module docstring, float64. ``stride``: see
    :func:`_masked_copies` (None: every value masked alone)."""
    if stride is not None and stride < 1:
        raise ValueError(f"stride must be >= 1 or None, got {stride}")
    markers = markers or {}
    kind_ids = [torch.as_tensor(sorted(markers.get(kind, ())), dtype=torch.long) for kind in MARKER_STATS]
    was_training = tvm.training
    tvm.eval()
    rows, window, spans = _masked_copies(data, mask_id, val_sep_id, stride)
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    out_rows, out_stats = [], []
    for idx in tqdm(length_batches(lengths, batch_tokens), desc="value surprise", disable=not progress,
                    leave=False):
        ids, mask = pad_batch([rows[i] for i in idx], pad_id)
        hidden = tvm(*to_model((ids, mask), tvm))  # [B, L, d_model], where the TVM is
        row, pos, value, targets, key_rows = [], [], [], [], []
        for j, i in enumerate(idx):
            tokens = data.windows[window[i]]
            for a, b in spans[i]:
                row.append(np.full(b - a, j))
                pos.append(np.arange(a, b))
                value.append(np.full(b - a, len(key_rows)))
                targets.append(tokens[a:b])
                key_rows.append(data.window_key[window[i]])
        row, pos, value = np.concatenate(row), np.concatenate(pos), np.concatenate(value)
        target = torch.as_tensor(np.concatenate(targets), dtype=torch.long)
        row_t, pos_t, on_model = to_model((torch.as_tensor(row), torch.as_tensor(pos), target), tvm)
        logits = tvm.mlm_logits(hidden[row_t, pos_t])  # [masked tokens, vocab]
        nll = -logits.float().log_softmax(-1).gather(1, on_model[:, None])[:, 0].cpu().numpy().astype(np.float64)
        per_value = np.zeros((len(key_rows), len(STATS)))
        for s, ids_of_kind in enumerate(kind_ids):  # the NLL a masked token adds to each marker statistic
            np.maximum.at(per_value[:, s], value, np.where(torch.isin(target, ids_of_kind).numpy(), nll, 0.0))
        np.maximum.at(per_value[:, STATS.index("token")], value, nll)
        np.add.at(per_value[:, STATS.index("value")], value, nll)
        out_rows.append(np.asarray(key_rows, dtype=np.int64))
        out_stats.append(per_value)
    tvm.train(was_training)
    if not out_rows:
        return np.zeros(0, dtype=np.int64), np.zeros((0, len(STATS)))
    return np.concatenate(out_rows), np.concatenate(out_stats)


def key_surprise(tvm: TemporalValueModeler, data: TokenizedSequences, mask_id: int, val_sep_id: int,
                 pad_id: int, markers: dict[str, frozenset[int]] | None = None, batch_tokens: int = 32768,
                 progress: bool = True, stride: int | None = None) -> np.ndarray:
    """[n_key_rows, len(STATS)] float32: per key row the largest, over its values, of each
    statistic of the module docstring (zero for a key row without values, and for a marker
    statistic whose marker a value does not carry). ``markers``: the ids of each kind of marker
    token (seqenc.tokenizer.ValueTokenizer.marker_kinds). ``stride``: None masks every value
    alone (one forward pass per value); ``s`` masks every s-th value of a window at once
    (:func:`_masked_copies`; cost and effect in the module docstring)."""
    key_row, per_value = value_surprise(tvm, data, mask_id, val_sep_id, pad_id, markers, batch_tokens, progress,
                                        stride)
    out = np.zeros((len(data.keys), len(STATS)), dtype=np.float64)
    for s in range(len(STATS)):
        np.maximum.at(out[:, s], key_row, per_value[:, s])
    return out.astype(np.float32)


def tail_fit(x: np.ndarray, min_scale: float) -> tuple[float, float]:
    """``(centre, scale)`` such that ``(v - centre) / scale`` estimates -log P(X >= v) for v in
    the upper tail of the sample ``x`` (peaks over threshold): the threshold t is the
    ``ceil(TAIL_SHARE * n)``-th largest value (at least the 2nd), the excesses over t are taken
    as exponential with mean ``scale`` (floored at ``min_scale``), and t itself scores
    -log((k + 1) / (n + 1)). Below t the same line goes on (a low score, and only the ranking
    of normal values changes there). A sample of one value: centre that value, scale 1."""
    x = np.sort(np.asarray(x, dtype=np.float64))[::-1]
    n = len(x)
    if n < 2:
        return float(x[0]), 1.0
    k = min(max(math.ceil(TAIL_SHARE * n), 2), n)
    t = x[k - 1]
    scale = max(float((x[:k] - t).sum()) / (k - 1), min_scale)
    return float(t - scale * math.log((n + 1) / (k + 1))), scale


def squash(score: np.ndarray) -> np.ndarray:
    """The score up to ``SQUASH_KNEE``, then ``knee + log1p(score - knee)``: increasing, and
    continuous with its slope at the knee. Why (issue 50): a tail line extrapolates far past its
    reference (a long parameter value's 52-157 nats on bgl read 27-104 tail units), and
    in float64 sigmoid(s) is exactly 1.0 for every s above ~36.7. Those sequences then tied at
    P = 1.0 -- 7-25 of bgl's 376 dev windows, 1,818 of hdfs's 4,244 dev blocks at seed 0 -- and
    a contamination share below their share put the cut at 1.0, where nothing is flagged (ties at
    the cut are not, training.engine.unlabelled.quantile_cut): the most surprising sequences
    were never flagged. Squashed, the sigmoid keeps every score apart up to ~1e11."""
    score = np.asarray(score, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        over = np.log1p(np.maximum(score - SQUASH_KNEE, 0.0))
    return np.where(score > SQUASH_KNEE, SQUASH_KNEE + over, score)


def unsquash(squashed: np.ndarray) -> np.ndarray:
    """The inverse of :func:`squash`: the scorer's own score (tail units) back from a squashed
    one, e.g. the logit of a probability :meth:`SurpriseScorer.combine` gave."""
    squashed = np.asarray(squashed, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        back = SQUASH_KNEE + np.expm1(np.maximum(squashed - SQUASH_KNEE, 0.0))
    return np.where(squashed > SQUASH_KNEE, back, squashed)


def score_probability(score: np.ndarray) -> np.ndarray:
    """P(anomaly) of a tail score: sigmoid(squash(score)), as :meth:`SurpriseScorer.combine` gives it."""
    return 1.0 / (1.0 + np.exp(-np.clip(squash(score), -500, 500)))


def probability_score(probs: np.ndarray) -> np.ndarray:
    """The inverse of :func:`score_probability`: the tail score back from P(anomaly) (clipped
    to 1e-12 from 0 and 1; NaN stays NaN), e.g. for a rule on the scores' distribution."""
    return unsquash(_logit_of(np.asarray(probs, dtype=np.float64)))


def _logit_of(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-12, 1 - 1e-12)
    return np.log(p) - np.log1p(-p)


def _logit(probs: np.ndarray) -> np.ndarray:
    return _logit_of(probs[:, 1].astype(np.float64))


def _line(values) -> np.ndarray:
    """A fitted centre or scale list as floats; None (a line left out) becomes nan."""
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


def key_maxima(stats: np.ndarray, data: TokenizedSequences, centre: dict[str, list[float]],
               scale: dict[str, list[float]]) -> np.ndarray:
    """[n_sequences, len(STATS)]: per statistic, the largest key score ``(stat - centre) / scale``
    over each sequence's keys in ``centre`` (-inf for a sequence with none; a (key, statistic)
    whose line is None, left out by the fit, counts as none)."""
    z = np.full((len(data.keys), len(STATS)), -np.inf)
    lines = {key: (_line(centre[key]), _line(scale[key])) for key in centre}
    for r, key in enumerate(data.keys):
        if key in lines:
            c, sc = lines[key]
            z[r] = np.where(np.isnan(c), -np.inf, (stats[r] - np.nan_to_num(c)) / np.nan_to_num(sc, nan=1.0))
    out = np.full((data.n_sequences, len(STATS)), -np.inf)
    np.maximum.at(out, data.key_seq, z)
    return out


def _trimmed(x: np.ndarray, trim: float) -> np.ndarray:
    """``x`` without its ``floor(trim * n)`` largest values (at least 2 kept when there are)."""
    x = np.sort(np.asarray(x, dtype=np.float64))
    drop = min(int(trim * len(x)), max(len(x) - 2, 0))
    return x[:len(x) - drop]


def _finite_fit(x: np.ndarray, min_scale: float, trim: float = 0.0) -> tuple[float | None, float | None]:
    """:func:`tail_fit` of the finite values of ``x`` (less the ``trim`` share of the largest);
    (None, None) when there are none."""
    x = x[np.isfinite(x)]
    return tail_fit(_trimmed(x, trim), min_scale) if len(x) else (None, None)


@dataclass
class SurpriseScorer:
    """Tail scores of the surprise statistics per key and of the KA's logit, fitted on normal
    sequences (module docstring); :meth:`combine` turns KA probabilities into combined ones.

    Without a KA line (``ka_centre`` None: fitted with ``ka_probs=None``, the unlabelled
    trainer, training.engine.unlabelled) the score is the surprise alone; such a fit also leaves out
    every (key, statistic) that is zero on all the fitted sequences (a marker the tokenizer does
    not add, a bin token of a key without bins): a constant line scores every sequence the same,
    -log TAIL_SHARE, which would tie all sequences below the tail -- harmless for a threshold in
    the tail, not for one below it (a contamination share above TAIL_SHARE). ``stride``: how the
    statistics were computed (:func:`key_surprise`), so that scoring computes them the same way."""

    centre: dict[str, list[float | None]]  # per key, per statistic (tail_fit); None: left out
    scale: dict[str, list[float | None]]
    ka_centre: float | None  # the KA's logit (tail_fit); None: the score is the surprise alone
    ka_scale: float | None
    seq_centre: list[float | None]  # per statistic: its largest key score over a sequence (tail_fit)
    seq_scale: list[float | None]
    stride: int | None = None  # key_surprise's stride: None = one masked copy per value
    # unlabelled scorers: the values the masked LM's sequences never held (seqenc.novel_values);
    # None: no such line
    novel: NovelValues | None = None

    @property
    def uses_ka(self) -> bool:
        return self.ka_centre is not None

    @classmethod
    def fit(cls, stats: np.ndarray, data: TokenizedSequences, ka_probs: np.ndarray | None,
            normal: np.ndarray, stride: int | None = None, trim: float = 0.0,
            novel: NovelValues | None = None) -> SurpriseScorer:
        """``normal``: indexes of the sequences to fit on (the normal dev sequences; for the
        unlabelled trainer, its reference sequences). ``ka_probs`` None: no KA line. ``trim``
        (no KA line only): every line is fitted without the ``trim`` share of the largest
        values it is fitted on -- a reference expected to hold that share of anomalies (the
        unlabelled trainer's contamination policy): a key that shows them would otherwise take
        them as its own tail and score them as the usual top of the reference. ``novel`` (no KA
        line only): the novel values' line (:meth:`novel_line`); nothing of it is fitted."""
        if (trim or novel is not None) and ka_probs is not None:
            raise ValueError("trim and novel are for a scorer without a KA line (unlabelled references)")
        if not 0 <= trim < 1:
            raise ValueError(f"trim must be in [0, 1), got {trim}")
        if len(normal) < 2:
            raise ValueError(f"surprise scoring needs at least 2 normal sequences to fit on, got {len(normal)}")
        in_fit = np.isin(data.key_seq, normal)
        keys = np.asarray(data.keys)
        centre, scale = {}, {}
        for key in sorted(set(keys[in_fit])):
            x = stats[in_fit & (keys == key)].astype(np.float64)
            fits = [(None, None) if ka_probs is None and not col.any() else tail_fit(_trimmed(col, trim),
                                                                                     STAT_MIN_SCALE)
                    for col in x.T]
            centre[key], scale[key] = [c for c, _ in fits], [s for _, s in fits]
        ka_centre = ka_scale = None
        if ka_probs is not None:
            ka_centre, ka_scale = tail_fit(_logit(ka_probs[normal]), MIN_SCALE)
        per_stat = key_maxima(stats, data, centre, scale)[normal]  # [n_fit, len(STATS)]
        if ka_probs is None:
            seq = [_finite_fit(x, SEQ_MIN_SCALE, trim) for x in per_stat.T]
        else:  # the first version's fit, kept exactly
            seq = [tail_fit(x, SEQ_MIN_SCALE) for x in per_stat.T]
        return cls(centre, scale, ka_centre, ka_scale, [c for c, _ in seq], [s for _, s in seq], stride, novel)

    def sequence_surprise(self, stats: np.ndarray, data: TokenizedSequences) -> np.ndarray:
        """[n_sequences]: per statistic the largest key score, scored again against the fitted
        sequences' maxima; the largest of these (-inf for a sequence with no known key)."""
        per_stat = key_maxima(stats, data, self.centre, self.scale)
        c, s = _line(self.seq_centre), _line(self.seq_scale)
        with np.errstate(invalid="ignore"):
            z = np.where(np.isnan(c), -np.inf, (per_stat - np.nan_to_num(c)) / np.nan_to_num(s, nan=1.0))
        return np.nan_to_num(z, nan=-np.inf).max(1)

    def novel_line(self, data: TokenizedSequences, novel_counts: np.ndarray | None = None) -> np.ndarray | None:
        """[n_sequences] ``NOVEL_SCORE + log(n)`` for a sequence holding n > 0 novel values,
        -inf for one with none (the line then leaves its score alone); None without the line.
        ``novel_counts``: the counts of ``data``'s sequences when already computed."""
        if self.novel is None:
            return None
        n = self.novel.counts(data) if novel_counts is None else novel_counts
        with np.errstate(divide="ignore"):
            return np.where(n > 0, NOVEL_SCORE + np.log(np.maximum(n, 1.0)), -np.inf)

    def combine(self, ka_probs: np.ndarray | None, stats: np.ndarray, data: TokenizedSequences,
                novel_counts: np.ndarray | None = None) -> np.ndarray:
        """[n_sequences, 2] probabilities of the combined score sigmoid(squash(max(s_KA, s_surprise)));
        without a KA line sigmoid(squash(s_surprise)), and ``ka_probs`` is not read (may be None);
        with novel values sigmoid(squash(max(s_surprise, s_novel))) (``novel_counts`` as
        :meth:`novel_line`; :func:`squash` keeps the largest scores apart)."""
        score = self.sequence_surprise(stats, data)
        if self.uses_ka:
            score = np.maximum((_logit(ka_probs) - self.ka_centre) / self.ka_scale, score)
        novel = self.novel_line(data, novel_counts)
        if novel is not None:
            score = np.maximum(score, novel)
        p = score_probability(score)
        return np.stack([1.0 - p, p], axis=1)

    def to_dict(self) -> dict:
        return {"stats": list(STATS), "calibration": CALIBRATION, "centre": self.centre, "scale": self.scale,
                "ka_centre": self.ka_centre, "ka_scale": self.ka_scale,
                "seq_centre": self.seq_centre, "seq_scale": self.seq_scale, "stride": self.stride,
                "novel": None if self.novel is None else self.novel.to_dict()}

    @classmethod
    def from_dict(cls, d: dict) -> SurpriseScorer:
        if list(d.get("stats", [])) != list(STATS) or d.get("calibration") != CALIBRATION:
            raise ValueError(f"this surprise scorer (statistics {d.get('stats')}, calibration "
                             f"{d.get('calibration')}) predates this version's ({list(STATS)}, {CALIBRATION}): "
                             "retrain the model")

        def opt(x):
            return None if x is None else float(x)

        stride = d.get("stride")
        novel = d.get("novel")  # absent in bundles saved before the line: none
        return cls(d["centre"], d["scale"], opt(d["ka_centre"]), opt(d["ka_scale"]),
                   [opt(x) for x in d["seq_centre"]], [opt(x) for x in d["seq_scale"]],
                   None if stride is None else int(stride), None if novel is None else NovelValues.from_dict(novel))
