"""How data-parallel ranks divide the work that is not a batch: the KR cache and the surprise.

Under DeepSpeed with ``WORLD_SIZE`` > 1 (training.engine.engines.data_parallel) the trainers
divide three kinds of work between the ranks (choice; one rank does all of it, as before):

* **update steps** (TVM masked LM, KA task steps): every rank draws the *same* batch (same
  seeds) and reads and encodes only its rows ``rank::world`` of it
  (training.engine.engines.shard); DeepSpeed averages the gradients. The global batch is the
  configured one whatever the world size, so a run's hyper-parameters mean the same on 1 and on
  N ranks, and the batches follow the same order;
* **the KR cache refresh** (Algorithm 1, step 2b): the distinct windows of all S(k) (a window
  that several keys share is encoded once, as seqenc.inference.key_representations does), sorted
  by length and dealt out ``rank::world``; each rank encodes its share, an all-gather
  (``torch.distributed.all_gather``: gloo on CPU, NCCL on GPU) gives every rank every window's
  [CLS] vector and each pools the KRs of all key rows (:func:`sharded_key_representations`),
  because every rank's KA steps and evaluation read the KRs of any sequence. Dealt by length, so
  that every rank gets a similar mix of short and long windows and the shares differ by at most
  one window;
* **the final surprise** (seqenc.surprise, one forward pass per masked copy of a window: the
  costliest part of an anomaly job): rank ``r`` scores the scored sequences ``r::world``
  (whole sequences, since the statistics are per key row of a sequence), then
  :func:`all_gather_ragged` and every rank holds all the statistics.

What each rank did is counted, not assumed: the trainer adds to ``PhasedTrainer.work`` the
distinct windows and tokens it encoded in each refresh, the sequences it scored for the surprise, the
rows of batches it read, and the seconds these took; :func:`gather_work` collects every rank's
counts at the end of ``fit`` (``result["data_parallel"]``). They count this process's work: a
resumed job counts from the resume.

The value sequences are built by every rank, each its range of the sorted sequence ids (steps
1 and 4 of training.tasks.sequence_build; rank 0 does the split and the vocabulary and writes the
files). Every rank then reads the whole windows file: the KA's evaluation reads any sequence's
KRs and the MLM batches are drawn from all train windows (see the first point).
"""

from __future__ import annotations

import numpy as np
import torch
from tqdm.auto import tqdm

from seqenc.sequences import TokenizedSequences


def _device() -> torch.device:
    import torch.distributed as dist

    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def _active(world: int) -> bool:
    import torch.distributed as dist

    return world > 1 and dist.is_available() and dist.is_initialized()


def all_gather_ragged(local: torch.Tensor, world: int) -> list[torch.Tensor]:
    """Every rank's ``local`` ([n_r, ...], same trailing shape and dtype; n_r may differ), in rank
    order, on every rank (CPU tensors). One rank: ``[local]``."""
    if not _active(world):
        return [local]
    import torch.distributed as dist

    device = _device()
    sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([len(local)], dtype=torch.int64, device=device))
    sizes = [int(s.item()) for s in sizes]
    padded = torch.zeros(max(sizes), *local.shape[1:], dtype=local.dtype, device=device)
    padded[:len(local)] = local.to(device)
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    return [part[:n].cpu() for part, n in zip(parts, sizes)]


def gather_work(work: dict[str, float], rank: int, world: int) -> dict:
    """``{"rank", "world", "work": this rank's counts, "per_rank": [every rank's counts]}``; every
    rank must call it at the same point (the end of ``fit``)."""
    keys = sorted(work)
    mine = torch.tensor([float(work[k]) for k in keys], dtype=torch.float64)
    parts = all_gather_ragged(mine[None], world) if _active(world) else [mine[None]]
    per_rank = [{k: _number(k, v) for k, v in zip(keys, part[0].tolist())} for part in parts]
    return {"rank": rank, "world": world, "work": per_rank[rank] if len(per_rank) > rank else per_rank[0],
            "per_rank": per_rank}


def _number(key: str, value: float):
    return float(value) if key.endswith("seconds") else int(round(value))


def sharded_key_surprise(tvm, data: TokenizedSequences, sequences: np.ndarray, rank: int, world: int,
                         **kwargs) -> np.ndarray:
    """seqenc.surprise.key_surprise of ``data.subset(sequences)`` ([its key rows, len(STATS)]),
    each rank scoring the sequences ``sequences[rank::world]`` and every rank gathering all;
    ``kwargs``: key_surprise's (mask_id, val_sep_id, pad_id, markers, progress, stride)."""
    from seqenc.surprise import key_surprise

    sequences = np.asarray(sequences, dtype=np.int64)
    if world == 1:
        return key_surprise(tvm, data.subset(sequences), **kwargs)
    mine = key_surprise(tvm, data.subset(sequences[rank::world]), **kwargs)
    parts = all_gather_ragged(torch.as_tensor(mine), world)
    offsets = data.key_rows_of()
    counts = offsets[sequences + 1] - offsets[sequences]
    starts = np.cumsum(counts) - counts  # where each sequence's key rows start in the subset
    out = np.zeros((int(counts.sum()), mine.shape[1]), dtype=mine.dtype)
    for r, part in enumerate(parts):
        chosen = np.arange(r, len(sequences), world)
        rows = np.concatenate([np.arange(starts[i], starts[i] + counts[i]) for i in chosen]) if len(chosen) \
            else np.zeros(0, dtype=np.int64)
        out[rows] = part.numpy()
    return out


def distinct_windows(data: TokenizedSequences) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
    """As seqenc.inference.key_representations finds them: (the distinct index of every window,
    the distinct windows in order of first occurrence, their lengths)."""
    first: dict[bytes, int] = {}  # a window's tokens (int64 bytes: compact, exact) -> its distinct index
    window_unique = np.fromiter((first.setdefault(np.asarray(w, dtype=np.int64).tobytes(), len(first))
                                 for w in data.windows), dtype=np.int64, count=len(data.windows))
    unique = [np.frombuffer(key, dtype=np.int64).copy() for key in first]
    lengths = np.fromiter((len(w) for w in unique), dtype=np.int64, count=len(unique))
    return window_unique, unique, lengths


def window_shares(lengths: np.ndarray, world: int) -> list[np.ndarray]:
    """The distinct windows each rank encodes: sorted by length, dealt out ``rank::world`` (one
    rank: all, in order of first occurrence, as key_representations)."""
    order = np.arange(len(lengths)) if world == 1 else np.argsort(lengths, kind="stable")
    return [order[r::world] for r in range(world)]


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


def sharded_key_representations(tvm, data: TokenizedSequences, pad_id: int, rank: int, world: int,
                                batch_tokens: int = 32768, progress: bool = True) -> tuple[torch.Tensor, dict]:
    """seqenc.inference.key_representations with the encoding divided between the ranks: ->
    (KR of every key row [n_key_rows, d_model] float32 on CPU, on every rank; this rank's counts
    ``{"windows", "tokens", "encode_seconds"}``: the distinct windows it encoded, their tokens, and
    the seconds of its own encoding, without the all-gather).

    The unit divided is the *distinct window*: key_representations encodes a window that occurs
    more than once (a constant key across sequences) once, and a key's KR is the mean of its
    windows' [CLS] vectors. The distinct windows are dealt out (:func:`window_shares`), each rank
    encodes its own, an all-gather gives every rank every window's vector, and each pools all
    key rows itself (a mean: cheap). Dividing key rows instead (the first version) made ranks
    re-encode the windows their rows share: measured on the demo size, 2 ranks refreshed only
    15 % faster than one. One rank: the same batches and the same result as key_representations."""
    import time

    from seqenc.model import pool_windows

    window_unique, unique, lengths = distinct_windows(data)
    shares = window_shares(lengths, world)
    t0 = time.perf_counter()
    mine = encode_windows(tvm, unique, lengths, shares[rank], pad_id, batch_tokens, progress)
    encode_seconds = time.perf_counter() - t0
    if world == 1:
        cls_vectors = mine
    else:
        cls_vectors = torch.empty(len(unique), tvm.config.d_model)
        for share, part in zip(shares, all_gather_ragged(mine, world)):
            cls_vectors[torch.as_tensor(share)] = part
    kr = pool_windows(cls_vectors[torch.as_tensor(window_unique)], torch.as_tensor(data.window_key), len(data.keys))
    return kr, {"windows": len(shares[rank]), "tokens": int(lengths[shares[rank]].sum()),
                "encode_seconds": encode_seconds}
