"""Reconstruction surprise: how badly the TVM's masked LM predicts the values of S(k).

The KA reads one vector per key, KR(k), and learns from labels which directions of it matter.
With few labelled anomalies it misses what a single unusual value shows (a port no normal block
uses, an ``[ALONE]`` marker where a key's values always link, seqenc.links), although the TVM
has learned what is usual there. This module reads that knowledge directly, as LogBERT scores
log sequences by masked-token prediction, and adds it to the KA's score of a binary task.

Per value v_i of S(k): every token of v_i is masked at once (one masked copy of the window per
value) and the TVM (eval mode) predicts them. The statistic per key row is ``lead_max``: the
largest negative log-likelihood of a value's *first* token -- the link marker when value links
are on (seqenc.links), else the bin token of a numeric value (seqenc.numeric), else the value's
first piece. With links on, a foreign node in S(src_ip) is an ``[ALONE]`` where the TVM expects
``[LINKED]`` with near certainty: a clear, categorical surprise. Use it with value links (and
bins); without them the first piece of an identifier is as unpredictable in normal sequences.

Measured before choosing it (value_anomaly, links and 16 bins, the bench's settings): the NLL of
a value's *other* tokens (largest or mean per key) is heavy-tailed for keys of random
identifiers -- ``file`` paths, source ports -- so that with it in the maximum, 98-122 of 270
normal test blocks had a standardised surprise above 5 and the combined test F1 fell to 0.54 and
0.24 (seeds 0, 1; the KA alone 0.57 and 0.77); with the first token only it was 0.71 and 0.77.

Measured (``seqenc bench accuracy --datasets value_anomaly --modes interleaved,interleaved+surprise
--seeds 0,1,2 --config '{"model": {"value_links": true, "numeric_bins": 16}}'``): test F1 0.709
+- 0.009 (0.719 / 0.708 / 0.700) against the KA alone's 0.559 +- 0.170 from the same training.
By kind over the three seeds' test blocks (a one-thread rescoring of the saved runs, within a
block or two of the bench): foreign_node 14/15 (KA alone 1/15), odd_port 15/24 (9/24),
oversize 18/27 (20/27), size_mismatch 16/24 (18/24), at 33 false positives among ~810 normal
test blocks (KA alone 23). Computing it took about 35 s on value_anomaly (134k values, two
CPU threads); it has not been measured on hdfs, where every block has many more values.

:class:`SurpriseScorer` is fitted on the train split's *normal* sequences (label 0): a centre
and a scale per (key, statistic), and the same for the KA's logit. A sequence's surprise is its
largest standardised statistic over its keys (keys never seen in training are skipped); the
combined anomaly score is ``max(z_KA, z_surprise)`` through a sigmoid, so an anomaly either
model is sure of scores high. Both parts are parameter-free given the fit, and the decision
threshold is still chosen on dev (training.phased).

Choices (the TVM-KA paper scores with the KA alone; this is an option,
``TVMKAConfig.surprise_scoring``, binary tasks only):

* computed once, from the final TVM, in the final phase (not at every KR refresh): one forward
  pass per value costs about as much as 7 KR refreshes on value_anomaly, and the rounds' dev
  metrics stay the KA's;
* the standardisation uses the normal train sequences' mean and standard deviation (floored
  at ``MIN_SCALE``), as a z-score of "how unusual for this key";
* the fitted centres and scales are JSON in the bundle's ``metadata.json`` (training.scoring),
  so batch scoring and the pyfunc combine the scores the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from seqenc.inference import length_batches, pad_batch
from seqenc.model import TemporalValueModeler
from seqenc.sequences import TokenizedSequences

STATS = ("lead_max",)
MIN_SCALE = 1e-3  # nats


def _masked_copies(data: TokenizedSequences, mask_id: int, val_sep_id: int):
    """One copy of a window per value, that value's tokens masked: rows, their window, and the
    position of the value's first token."""
    rows, window, first = [], [], []
    for w, tokens in enumerate(data.windows):
        seps = [i for i, t in enumerate(tokens) if t == val_sep_id] + [len(tokens)]
        for a, b in zip(seps[:-1], seps[1:]):
            if b - a > 1:  # a value of at least one token
                rows.append(tokens[:a + 1] + [mask_id] * (b - a - 1) + tokens[b:])
                window.append(w)
                first.append(a + 1)
    return rows, np.asarray(window, dtype=np.int64), first


@torch.no_grad()
def key_surprise(tvm: TemporalValueModeler, data: TokenizedSequences, mask_id: int, val_sep_id: int,
                 pad_id: int, batch_tokens: int = 32768, progress: bool = True) -> np.ndarray:
    """[n_key_rows, len(STATS)] float32: the statistic of the module docstring per key row
    (zero for a key row without values)."""
    was_training = tvm.training
    tvm.eval()
    rows, window, first = _masked_copies(data, mask_id, val_sep_id)
    lead_nll = np.zeros(len(rows), dtype=np.float64)
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    for idx in tqdm(length_batches(lengths, batch_tokens), desc="value surprise", disable=not progress,
                    leave=False):
        ids, mask = pad_batch([rows[i] for i in idx], pad_id)
        hidden = tvm(ids, mask)  # [B, L, d_model]
        pos = torch.as_tensor([first[i] for i in idx])  # each row's masked first token
        target = torch.as_tensor([data.windows[window[i]][first[i]] for i in idx])
        logits = tvm.mlm_logits(hidden[torch.arange(len(idx)), pos])  # [B, vocab]
        lead_nll[idx] = -logits.float().log_softmax(-1).gather(1, target[:, None])[:, 0].numpy()
    tvm.train(was_training)

    key_row = data.window_key[window]
    n = len(data.keys)
    out = np.zeros((n, len(STATS)), dtype=np.float64)
    np.maximum.at(out[:, 0], key_row, lead_nll)
    return out.astype(np.float32)


def _logit(probs: np.ndarray) -> np.ndarray:
    p = np.clip(probs[:, 1].astype(np.float64), 1e-12, 1 - 1e-12)
    return np.log(p) - np.log1p(-p)


@dataclass
class SurpriseScorer:
    """Standardisation of the surprise statistics per key and of the KA's logit (module
    docstring); :meth:`combine` turns KA probabilities into combined ones."""

    centre: dict[str, list[float]]
    scale: dict[str, list[float]]
    ka_centre: float
    ka_scale: float

    @classmethod
    def fit(cls, stats: np.ndarray, data: TokenizedSequences, ka_probs: np.ndarray,
            normal: np.ndarray) -> SurpriseScorer:
        """``normal``: indexes of the sequences to fit on (the normal train sequences)."""
        if len(normal) < 2:
            raise ValueError(f"surprise scoring needs at least 2 normal train sequences, got {len(normal)}")
        in_fit = np.isin(data.key_seq, normal)
        keys = np.asarray(data.keys)
        centre, scale = {}, {}
        for key in sorted(set(keys[in_fit])):
            x = stats[in_fit & (keys == key)].astype(np.float64)
            centre[key] = x.mean(0).tolist()
            scale[key] = np.maximum(x.std(0), MIN_SCALE).tolist() if len(x) > 1 else [1.0] * len(STATS)
        logit = _logit(ka_probs[normal])
        return cls(centre, scale, float(logit.mean()), float(max(logit.std(), MIN_SCALE)))

    def sequence_surprise(self, stats: np.ndarray, data: TokenizedSequences) -> np.ndarray:
        """[n_sequences]: the largest standardised statistic over each sequence's known keys
        (-inf for a sequence with none)."""
        z = np.full(len(data.keys), -np.inf)
        for r, key in enumerate(data.keys):
            if key in self.centre:
                z[r] = ((stats[r] - np.asarray(self.centre[key])) / np.asarray(self.scale[key])).max()
        out = np.full(data.n_sequences, -np.inf)
        np.maximum.at(out, data.key_seq, z)
        return out

    def combine(self, ka_probs: np.ndarray, stats: np.ndarray, data: TokenizedSequences) -> np.ndarray:
        """[n_sequences, 2] probabilities of the combined score sigmoid(max(z_KA, z_surprise))."""
        z_ka = (_logit(ka_probs) - self.ka_centre) / self.ka_scale
        score = np.maximum(z_ka, self.sequence_surprise(stats, data))
        p = 1.0 / (1.0 + np.exp(-np.clip(score, -500, 500)))
        return np.stack([1.0 - p, p], axis=1)

    def to_dict(self) -> dict:
        return {"stats": list(STATS), "centre": self.centre, "scale": self.scale,
                "ka_centre": self.ka_centre, "ka_scale": self.ka_scale}

    @classmethod
    def from_dict(cls, d: dict) -> SurpriseScorer:
        if list(d.get("stats", [])) != list(STATS):
            raise ValueError(f"surprise statistics {d.get('stats')} differ from this version's {list(STATS)}")
        return cls(d["centre"], d["scale"], float(d["ka_centre"]), float(d["ka_scale"]))
