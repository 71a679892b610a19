"""Reconstruction surprise: how badly the TVM's masked LM predicts the values of S(k).

The KA reads one vector per key, KR(k), and learns from labels which directions of it matter.
With few labelled anomalies it misses what a single unusual value shows (a port no normal block
uses, an ``[ALONE]`` marker where a key's values always link, seqenc.links), although the TVM
has learned what is usual there. This module reads that knowledge directly, as LogBERT scores
log sequences by masked-token prediction, and adds it to the KA's score of a binary task.

Per value v_i of S(k): every token of v_i is masked at once (one masked copy of the window per
value) and the TVM (eval mode) predicts them. Three statistics per value, each maxed over the
values of a key row (``STATS``):

* ``lead``: the largest negative log-likelihood (NLL) among the value's marker tokens -- link
  and repeat markers (seqenc.links), bin token (seqenc.numeric) -- or of its first token when
  it has none. A foreign node in S(src_ip) is an ``[ALONE]`` where the TVM expects ``[LINKED]``
  with near certainty: a clear, categorical surprise;
* ``token``: the largest NLL of any of the value's tokens (a port piece ``50020`` where every
  normal block has ``50010``);
* ``value``: the NLL of the whole value, summed over its tokens.

:class:`SurpriseScorer` standardises each (key, statistic) with the mean and standard deviation
(floored at ``MIN_SCALE``) of the *dev* split's normal sequences, and the KA's logit the same
way. Then, per statistic, a sequence's largest z-score over its keys (keys the fit never saw are
skipped) is standardised *again* on the same normal sequences, and a sequence's surprise is the
largest of these. The combined anomaly score is ``max(z_KA, z_surprise)`` through a sigmoid, so
an anomaly either model is sure of scores high. The decision threshold is still chosen on dev
(training.phased).

Why the second standardisation: a maximum over ~13 keys is large even on a normal sequence (on
value_anomaly's normal dev blocks each statistic's maximum has mean 1.6-1.9 and standard
deviation 0.7-1.1), while z_KA has mean 0 and standard deviation 1. Compared raw, the
surprise's maximum sets the threshold, and a size anomaly that only the KA sees (an
``oversize`` block) falls under it. Standardising each statistic's maximum puts the three and
z_KA on one scale. Rescoring the three saved runs of the bench below with this scorer (one
thread, ``/work/scratch/combo_product.py``): test F1 0.812 -> 0.846, oversize 14 -> 18 of 27,
size_mismatch 12 -> 14 of 24, odd_port 22 -> 24 of 24, false positives 2 -> 7 (of 810 normal).
The bench itself, retrained: 0.835 +- 0.053 (0.877 / 0.776 / 0.852) against 0.817 +- 0.039.

Why dev and not train: the TVM is trained by MLM on the train sequences and memorises their
random identifiers. Measured on value_anomaly (seed 0, links and 16 bins): the summed NLL of
S(block) was 38.7 +- 22.0 on normal train blocks and 65.6 +- 5.4 on normal test blocks, and of
S(file) 58.9 against 116.3. Standardised on train, an unseen block looks surprising for being
unseen; the KA's logit is likewise more confident on the sequences it was trained on. Dev
sequences are unseen by both, as the sequences scored later are.

Why three statistics: each finds a different anomaly (value_anomaly): ``lead`` the foreign
nodes, ``token`` the odd ports; ``value`` adds a little (a scratch rescoring of the links + bins
runs: test F1 0.738 with lead and token, 0.753 with all three). With value links, repeats and
bins, the surprise alone found foreign_node 14/15 and odd_port 20/24 test blocks over three
seeds with no false positive, and no oversize or size_mismatch block (docs/training.md). Standardised on train
instead, ``token`` and ``value`` were unusable (98-122 of 270 normal test blocks above z = 5),
which is why an earlier version kept ``lead`` alone.

Measured (``seqenc bench accuracy --datasets value_anomaly --modes interleaved+surprise --seeds
0,1,2 --config '{"model": {"value_links": true, "value_repeats": true, "numeric_bins": 16}}'``):
test F1 0.835 +- 0.053 (0.877 / 0.776 / 0.852), 0.817 +- 0.039 before the second
standardisation; the first version (``lead`` on the first token
only, standardised on train, no repeats) reached 0.709 +- 0.009.

On real logs it did not help: bgl (BGL_2k windows, default model, seeds 0-2, one training scored
both ways) 0.885 +- 0.052 with the KA alone, 0.846 +- 0.116 with the surprise (docs/training.md).

Choices (the TVM-KA paper scores with the KA alone; this is an option,
``TVMKAConfig.surprise_scoring``, binary tasks only):

* computed once, from the final TVM, in the final phase (not at every KR refresh): one forward
  pass per value costs about as much as 7 KR refreshes on value_anomaly, and the rounds' dev
  metrics stay the KA's;
* the fitted centres and scales are JSON in the bundle's ``metadata.json`` (training.scoring),
  so batch scoring and the pyfunc combine the scores the same way;
* cost: about 35 s on value_anomaly (134k values, two CPU threads); not measured on hdfs, where
  every block has many more values.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from seqenc.inference import length_batches, pad_batch
from seqenc.model import TemporalValueModeler
from seqenc.sequences import TokenizedSequences, value_spans

STATS = ("lead", "token", "value")
MIN_SCALE = 1e-3  # nats


def _masked_copies(data: TokenizedSequences, mask_id: int, val_sep_id: int):
    """One copy of a window per value, that value's tokens masked: rows, their window, and the
    span (start, end) of the value's tokens."""
    rows, window, spans = [], [], []
    for w, tokens in enumerate(data.windows):
        for a, b in value_spans(tokens, val_sep_id):
            if b > a:  # a value of at least one token
                rows.append(tokens[:a] + [mask_id] * (b - a) + tokens[b:])
                window.append(w)
                spans.append((a, b))
    return rows, np.asarray(window, dtype=np.int64), spans


@torch.no_grad()
def key_surprise(tvm: TemporalValueModeler, data: TokenizedSequences, mask_id: int, val_sep_id: int,
                 pad_id: int, marker_ids: frozenset[int] = frozenset(), batch_tokens: int = 32768,
                 progress: bool = True) -> np.ndarray:
    """[n_key_rows, len(STATS)] float32: per key row the largest, over its values, of each
    statistic of the module docstring (zero for a key row without values). ``marker_ids``: the
    tokens that may lead a value (seqenc.tokenizer.ValueTokenizer.marker_ids)."""
    was_training = tvm.training
    tvm.eval()
    rows, window, spans = _masked_copies(data, mask_id, val_sep_id)
    per_value = np.zeros((len(rows), len(STATS)), dtype=np.float64)
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    for idx in tqdm(length_batches(lengths, batch_tokens), desc="value surprise", disable=not progress,
                    leave=False):
        ids, mask = pad_batch([rows[i] for i in idx], pad_id)
        hidden = tvm(ids, mask)  # [B, L, d_model]
        row = np.concatenate([np.full(spans[i][1] - spans[i][0], j) for j, i in enumerate(idx)])
        pos = np.concatenate([np.arange(*spans[i]) for i in idx])
        target = torch.as_tensor(np.concatenate([data.windows[window[i]][slice(*spans[i])] for i in idx]))
        logits = tvm.mlm_logits(hidden[torch.as_tensor(row), torch.as_tensor(pos)])  # [masked tokens, vocab]
        nll = -logits.float().log_softmax(-1).gather(1, target[:, None])[:, 0].numpy()
        start = 0
        for i in idx:
            a, b = spans[i]
            value_nll, value_tokens = nll[start:start + b - a], target[start:start + b - a].tolist()
            start += b - a
            n_lead = next((t for t, tok in enumerate(value_tokens) if tok not in marker_ids), b - a) or 1
            per_value[i] = value_nll[:n_lead].max(), value_nll.max(), value_nll.sum()
    tvm.train(was_training)

    key_row = data.window_key[window]
    out = np.zeros((len(data.keys), len(STATS)), dtype=np.float64)
    for s in range(len(STATS)):
        np.maximum.at(out[:, s], key_row, per_value[:, s])
    return out.astype(np.float32)


def _logit(probs: np.ndarray) -> np.ndarray:
    p = np.clip(probs[:, 1].astype(np.float64), 1e-12, 1 - 1e-12)
    return np.log(p) - np.log1p(-p)


def key_maxima(stats: np.ndarray, data: TokenizedSequences, centre: dict[str, list[float]],
               scale: dict[str, list[float]]) -> np.ndarray:
    """[n_sequences, len(STATS)]: per statistic, the largest per-key z-score ``(stat - centre) /
    scale`` over each sequence's keys in ``centre`` (-inf for a sequence with none)."""
    z = np.full((len(data.keys), len(STATS)), -np.inf)
    for r, key in enumerate(data.keys):
        if key in centre:
            z[r] = (stats[r] - np.asarray(centre[key])) / np.asarray(scale[key])
    out = np.full((data.n_sequences, len(STATS)), -np.inf)
    np.maximum.at(out, data.key_seq, z)
    return out


@dataclass
class SurpriseScorer:
    """Standardisation of the surprise statistics per key and of the KA's logit (module
    docstring); :meth:`combine` turns KA probabilities into combined ones."""

    centre: dict[str, list[float]]
    scale: dict[str, list[float]]
    ka_centre: float
    ka_scale: float
    seq_centre: list[float]  # per statistic: centre and scale of its sequence maximum
    seq_scale: list[float]

    @classmethod
    def fit(cls, stats: np.ndarray, data: TokenizedSequences, ka_probs: np.ndarray,
            normal: np.ndarray) -> SurpriseScorer:
        """``normal``: indexes of the sequences to fit on (the normal dev sequences)."""
        if len(normal) < 2:
            raise ValueError(f"surprise scoring needs at least 2 normal sequences to fit on, got {len(normal)}")
        in_fit = np.isin(data.key_seq, normal)
        keys = np.asarray(data.keys)
        centre, scale = {}, {}
        for key in sorted(set(keys[in_fit])):
            x = stats[in_fit & (keys == key)].astype(np.float64)
            centre[key] = x.mean(0).tolist()
            scale[key] = np.maximum(x.std(0), MIN_SCALE).tolist() if len(x) > 1 else [1.0] * len(STATS)
        logit = _logit(ka_probs[normal])
        per_stat = key_maxima(stats, data, centre, scale)[normal]  # [n_fit, len(STATS)]
        return cls(centre, scale, float(logit.mean()), float(max(logit.std(), MIN_SCALE)),
                   per_stat.mean(0).tolist(), np.maximum(per_stat.std(0), MIN_SCALE).tolist())

    def sequence_surprise(self, stats: np.ndarray, data: TokenizedSequences) -> np.ndarray:
        """[n_sequences]: per statistic the largest per-key z-score, standardised again over
        the fitted sequences; the largest of these (-inf for a sequence with no known key)."""
        per_stat = key_maxima(stats, data, self.centre, self.scale)
        return ((per_stat - np.asarray(self.seq_centre)) / np.asarray(self.seq_scale)).max(1)

    def combine(self, ka_probs: np.ndarray, stats: np.ndarray, data: TokenizedSequences) -> np.ndarray:
        """[n_sequences, 2] probabilities of the combined score sigmoid(max(z_KA, z_surprise))."""
        z_ka = (_logit(ka_probs) - self.ka_centre) / self.ka_scale
        score = np.maximum(z_ka, self.sequence_surprise(stats, data))
        p = 1.0 / (1.0 + np.exp(-np.clip(score, -500, 500)))
        return np.stack([1.0 - p, p], axis=1)

    def to_dict(self) -> dict:
        return {"stats": list(STATS), "centre": self.centre, "scale": self.scale,
                "ka_centre": self.ka_centre, "ka_scale": self.ka_scale,
                "seq_centre": self.seq_centre, "seq_scale": self.seq_scale}

    @classmethod
    def from_dict(cls, d: dict) -> SurpriseScorer:
        if list(d.get("stats", [])) != list(STATS):
            raise ValueError(f"surprise statistics {d.get('stats')} differ from this version's {list(STATS)}")
        if "seq_centre" not in d:
            raise ValueError("this surprise scorer predates the sequence-level standardisation "
                             "(no seq_centre): retrain the model")
        return cls(d["centre"], d["scale"], float(d["ka_centre"]), float(d["ka_scale"]),
                   [float(x) for x in d["seq_centre"]], [float(x) for x in d["seq_scale"]])
