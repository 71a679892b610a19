"""How data-parallel ranks divide the work: the batches, the KR cache and the surprise.

Under DeepSpeed with ``WORLD_SIZE`` > 1 (training.engine.engines.data_parallel) each rank holds
the windows of its own share of the sequences and the index of all (training.engine.rank_share),
and the trainers divide the work between the ranks (one rank does all of it, as before):

* **masked-LM steps**: each rank draws its batches from its share's train windows, ``batch_tokens
  / world`` tokens each; DeepSpeed averages the gradients, so one update reads about the
  configured batch across all ranks;
* **KA task steps** (on the cached KRs, no windows): every rank draws the *same* batch of
  sequences (same seeds) and reads only its rows ``rank::world`` of it
  (training.engine.engines.shard). The global batch is the configured one whatever the world
  size and the batches follow the same order;
* **the KR cache refresh** (Algorithm 1, step 2b): the distinct windows of all S(k) (a window
  that several keys share is encoded once, as seqenc.inference.key_representations does). Each
  rank finds the distinct windows of its share; their digests and lengths are gathered, and
  every rank computes the same owner for each (:func:`assign_owners`: a window two shares hold is
  encoded by one). Each encodes its own, an all-gather (``torch.distributed.all_gather``: gloo on
  CPU, NCCL on GPU) gives every rank every window's [CLS] vector, each pools the KRs of its key
  rows, and a second all-gather gives every rank the KRs of all key rows
  (:func:`sharded_key_representations`), because the KA steps and the evaluation read the KRs of
  any sequence;
* **the final surprise** (seqenc.surprise, one forward pass per masked copy of a window: the
  costliest part of an anomaly job): each rank scores the scored sequences of its share
  (whole sequences, since the statistics are per key row of a sequence), then
  training.engine.collectives.gather_concat and every rank holds all the statistics.

What each rank did is counted, not assumed: the trainer adds to ``PhasedTrainer.work`` the
distinct windows and tokens it encoded in each refresh, the sequences it scored for the surprise, the
rows of batches it read, and the seconds these took; training.engine.collectives.gather_work
collects every rank's counts at the end of ``fit`` (``result["data_parallel"]``). They count this
process's work: a resumed job counts from the resume.

The value sequences are built by every rank, each its range of the sorted sequence ids (steps
1 and 4 of training.tasks.sequence_build; rank 0 does the split and the vocabulary and writes the
files). The end-to-end modes (training.engine.end_to_end: each update encodes the windows of its
batch's sequences) still read the whole windows file on every rank; each rank computes the rows
``rank::world`` of their evaluations, then all gather.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from tqdm.auto import tqdm

from seqenc.sequences import TokenizedSequences
from training.engine.collectives import all_gather_ragged, gather_concat

if TYPE_CHECKING:
    from training.engine.rank_share import RankShare


def sharded_key_surprise(tvm, share: RankShare, sequences: np.ndarray, **kwargs) -> np.ndarray:
    """seqenc.surprise.key_surprise of the sequences ``sequences`` (increasing indexes into the
    index), [their key rows, len(STATS)]: each rank scores those of its own share
    (training.engine.rank_share), and every rank gathers all; ``kwargs``: key_surprise's
    (mask_id, val_sep_id, pad_id, markers, progress, stride)."""
    from seqenc.surprise import key_surprise

    sequences = np.asarray(sequences, dtype=np.int64)
    if np.any(np.diff(sequences) <= 0):
        raise ValueError("the sequences to score must be increasing indexes")
    return gather_concat(key_surprise(tvm, share.local_part(sequences), **kwargs), share.world)


# --- the KR refresh ------------------------------------------------------------------------------
def distinct_windows(data: TokenizedSequences) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
    """As seqenc.inference.key_representations finds them: (the distinct index of every window,
    the distinct windows in order of first occurrence, their lengths)."""
    first: dict[bytes, int] = {}  # a window's tokens (int64 bytes: compact, exact) -> its distinct index
    window_unique = np.fromiter((first.setdefault(np.asarray(w, dtype=np.int64).tobytes(), len(first))
                                 for w in data.windows), dtype=np.int64, count=len(data.windows))
    unique = [np.frombuffer(key, dtype=np.int64).copy() for key in first]
    lengths = np.fromiter((len(w) for w in unique), dtype=np.int64, count=len(unique))
    return window_unique, unique, lengths


def window_digests(unique: list[np.ndarray]) -> np.ndarray:
    """[n, 2] int64: a 128-bit BLAKE2b digest of each window's tokens (int64 bytes). Two ranks
    holding the same window find it by its digest; 128 bits make a collision (two windows taken
    for one) as likely as a hardware error."""
    out = np.zeros((len(unique), 2), dtype=np.int64)
    for i, w in enumerate(unique):
        out[i] = np.frombuffer(hashlib.blake2b(w.tobytes(), digest_size=16).digest(), dtype=np.int64)
    return out


def assign_owners(digests: list[np.ndarray], lengths: list[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray],
                                                                                int]:
    """Which rank encodes each distinct window, from every rank's distinct windows (their
    digests [n_r, 2] and lengths [n_r]); -> (per rank, the global index of each of its windows;
    per rank, the local indexes of the windows it encodes; the number of global windows).

    A window one rank holds is that rank's. A window several ranks hold (a constant key across
    sequences of several shares) goes to the holder with the fewest tokens so far, longest
    first (choice: a greedy balance of the tokens each rank encodes). Every rank computes the
    same answer from the same gathered input."""
    world = len(digests)
    ranks = np.concatenate([np.full(len(d), r, dtype=np.int64) for r, d in enumerate(digests)])
    flat = np.concatenate(digests).reshape(-1, 2) if ranks.size else np.zeros((0, 2), dtype=np.int64)
    _, first, inverse = np.unique(flat, axis=0, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    n_global = len(first)
    length = np.concatenate(lengths)[first]
    holders = np.bincount(inverse, minlength=n_global)
    owner = np.full(n_global, -1, dtype=np.int64)
    alone = holders[inverse] == 1
    owner[inverse[alone]] = ranks[alone]
    load = np.bincount(owner[owner >= 0], weights=length[owner >= 0], minlength=world).astype(np.float64)
    shared = np.flatnonzero(holders > 1)
    holder_ranks: dict[int, list[int]] = {}
    for g, r in zip(inverse[~alone].tolist(), ranks[~alone].tolist()):
        holder_ranks.setdefault(g, []).append(r)
    for g in shared[np.argsort(-length[shared], kind="stable")].tolist():
        r = min(holder_ranks[g], key=lambda q: (load[q], q))
        owner[g] = r
        load[r] += length[g]
    to_global = [inverse[ranks == r] for r in range(world)]
    owned = [np.flatnonzero(owner[to_global[r]] == r) for r in range(world)]
    return to_global, owned, n_global


@dataclass
class RefreshPlan:
    """This rank's part of every KR refresh, fixed for a run (the windows do not change): its
    share's distinct windows (:func:`distinct_windows`), their global indexes, the local ones it
    encodes (``owned``), and, per rank, the global indexes of the windows that rank encodes, in
    its order (what the all-gather returns)."""

    window_unique: np.ndarray
    unique: list[np.ndarray]
    lengths: np.ndarray
    to_global: np.ndarray
    owned: np.ndarray
    owned_global: list[np.ndarray]
    n_global: int

    @classmethod
    def build(cls, local: TokenizedSequences, rank: int, world: int) -> RefreshPlan:
        """Collective when ``world`` > 1 (one all-gather of digests and lengths). One rank: every
        distinct window, in order of first occurrence, as key_representations encodes them."""
        window_unique, unique, lengths = distinct_windows(local)
        if world == 1:
            everything = np.arange(len(unique), dtype=np.int64)
            return cls(window_unique, unique, lengths, everything, everything, [everything], len(unique))
        mine = np.concatenate([window_digests(unique), lengths[:, None]], axis=1)  # [n, 3] int64
        parts = [p.numpy() for p in all_gather_ragged(torch.as_tensor(mine), world)]
        to_global, owned, n_global = assign_owners([p[:, :2] for p in parts], [p[:, 2] for p in parts])
        return cls(window_unique, unique, lengths, to_global[rank], owned[rank],
                   [to_global[r][owned[r]] for r in range(world)], n_global)


def sharded_key_representations(tvm, share: RankShare, plan: RefreshPlan, pad_id: int, batch_tokens: int = 32768,
                                progress: bool = True) -> tuple[torch.Tensor, dict]:
    """seqenc.inference.key_representations of every key row of the index, divided between the
    ranks: -> (KR of every key row [n_key_rows, d_model] float32 on CPU, on every rank; this
    rank's counts ``{"windows", "tokens", "encode_seconds"}``: the distinct windows it encoded,
    their tokens, and the seconds of its own encoding, without the all-gathers).

    The unit divided is the *distinct window*: key_representations encodes a window that occurs
    more than once (a constant key across sequences) once, and a key's KR is the mean of its
    windows' [CLS] vectors. Each rank holds the windows of its share of the sequences
    (training.engine.rank_share) and encodes those the plan gives it (:func:`assign_owners`: a
    window that several shares hold, once); an all-gather gives every rank every window's
    vector, each pools its own key rows, and a second all-gather gives every rank every KR.
    Dividing key rows without the shared windows' digests (the first version) made ranks
    re-encode the windows their rows share: measured on the demo size, 2 ranks refreshed only
    15 % faster than one. One rank: the same batches and the same result as key_representations."""
    import time

    from seqenc.model import pool_windows

    t0 = time.perf_counter()
    mine = encode_windows(tvm, plan.unique, plan.lengths, plan.owned, pad_id, batch_tokens, progress)
    encode_seconds = time.perf_counter() - t0
    if share.world == 1:
        cls_vectors = mine
    else:
        cls_vectors = torch.empty(plan.n_global, tvm.config.d_model)
        for owned, part in zip(plan.owned_global, all_gather_ragged(mine, share.world)):
            cls_vectors[torch.as_tensor(owned)] = part
    local = share.local
    kr = pool_windows(cls_vectors[torch.as_tensor(plan.to_global[plan.window_unique])],
                      torch.as_tensor(local.window_key), len(local.keys))
    if share.world > 1:
        kr = torch.cat(all_gather_ragged(kr, share.world))
    if len(kr) != len(share.index.keys):
        raise RuntimeError(f"the ranks gathered {len(kr)} KRs for {len(share.index.keys)} key rows")
    return kr, {"windows": len(plan.owned), "tokens": int(plan.lengths[plan.owned].sum()),
                "encode_seconds": encode_seconds}


@torch.no_grad()
def encode_windows(tvm, unique: list[np.ndarray], lengths: np.ndarray, share: np.ndarray, pad_id: int,
                   batch_tokens: int = 32768, progress: bool = True) -> torch.Tensor:
    """[len(share), d_model] float32 CPU: the [CLS] vectors of the distinct windows ``share``,
    the TVM in eval mode (its training mode restored after), batched by length as
    key_representations batches."""
    from seqenc.inference import length_batches, pad_batch, to_model

    was_training = tvm.training
    tvm.eval()
    out = torch.empty(len(share), tvm.config.d_model)
    for idx in tqdm(length_batches(lengths[share], batch_tokens), desc="key representations",
                    disable=not progress, leave=False):
        ids, mask = pad_batch([unique[share[i]] for i in idx], pad_id)
        out[torch.as_tensor(idx)] = tvm.key_representations(*to_model((ids, mask), tvm)).float().cpu()
    tvm.train(was_training)
    return out
