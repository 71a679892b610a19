"""The collectives of the data-parallel ranks (``torch.distributed``: gloo on CPU, NCCL on GPU),
in the shapes the trainers need: ragged all-gathers (ranks hold different numbers of rows) and
the gathering of every rank's work counts. One rank (no process group): each returns what it was
given. Used by training.engine.sharding (the KR refresh, the surprise), training.engine.rank_share
(each rank's share of the data) and the trainers."""

from __future__ import annotations

import numpy as np
import torch


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
    parts = all_gather_ragged(mine[None], world)
    per_rank = [{k: _number(k, v) for k, v in zip(keys, part[0].tolist())} for part in parts]
    return {"rank": rank, "world": world, "work": per_rank[rank] if len(per_rank) > rank else per_rank[0],
            "per_rank": per_rank}


def _number(key: str, value: float):
    return float(value) if key.endswith("seconds") else int(round(value))


def gather_concat(local: np.ndarray, world: int) -> np.ndarray:
    """Every rank's 1-d or 2-d ``local`` array concatenated in rank order, on every rank (the
    ranks' shares are contiguous, so this is the order of the whole); one rank: ``local``."""
    if world == 1:
        return local
    parts = all_gather_ragged(torch.as_tensor(np.ascontiguousarray(local)), world)
    return torch.cat(parts).numpy()
