"""How one network's parameters are updated: the optimizer, its schedule, clipping.

The trainer holds one engine per network it trains (the TVM and the KA in Algorithm 1) and
only calls ``backward(loss)``, ``step()``, ``state_dict()`` / ``load_state_dict()``. So the
same training loop runs on plain PyTorch (``PlainEngine``, a laptop CPU) and under DeepSpeed
(``make_engine`` with a DeepSpeed config: GPU clusters; DeepSpeed is imported only then).

Schedule (both engines): linear warm-up over ``warmup`` updates, then linear decay to 10% of
the peak learning rate at ``total`` updates.
"""

from __future__ import annotations

import os

import torch

from training.engine.schedule import lr_factor


def training_device(requested: str = "auto") -> torch.device:
    """Where a trainer without DeepSpeed puts its model: the one place that decides (choice:
    ``"auto"`` is the first CUDA device when there is one, else the CPU; MPS only when asked
    for). Every batch then follows the model (seqenc.inference.to_model). Under DeepSpeed the
    engine moves the model to its accelerator's device for this rank instead."""
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(requested)
    except RuntimeError as exc:
        raise ValueError(f"device {requested!r} is not a torch device (e.g. auto, cpu, cuda, cuda:1)") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {requested!r} asked for, but torch sees no CUDA device; use auto or cpu")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {requested!r} asked for, but MPS is not available; use auto or cpu")
    return device


class PlainEngine:
    """AdamW + warm-up/decay schedule + gradient-norm clipping, in plain PyTorch."""

    def __init__(self, network: torch.nn.Module, lr: float, weight_decay: float, warmup: int, total: int,
                 grad_clip: float):
        self.network, self.grad_clip = network, grad_clip
        self.params = [p for p in network.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=lr, weight_decay=weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: lr_factor(s, warmup, total))

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> None:
        torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])


def data_parallel(deepspeed: str | dict | None) -> tuple[int, int]:
    """(rank, world size) of this process: under DeepSpeed, what the launcher (``deepspeed``,
    ``torchrun``) set in ``RANK`` / ``WORLD_SIZE``; otherwise (0, 1).

    Data parallelism in the trainers (choice): a batch of sequences read through caches (KA
    steps) or drawn by an end-to-end trainer is the *same* on every rank (same seeds), each
    keeping rows ``rank::world`` of it (:func:`shard`), so one update reads the configured batch
    across all ranks and DeepSpeed's gradient average makes it one step over that batch; a
    masked-LM batch is each rank's own, drawn from the windows of its share of the sequences
    (training.engine.rank_share). Only rank 0 logs to MLflow and writes the model bundle; each
    rank keeps its own checkpoints and KR cache (ZeRO partitions the optimizer state per rank).
    The KR refresh and the final surprise are divided between the ranks and gathered
    (training.engine.sharding)."""
    if deepspeed is None:
        return 0, 1
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def shard(rows, rank: int, world: int):
    """Rows ``rank::world`` of a batch (a tensor, array or tuple of them, first dimension = rows);
    the whole batch when it has fewer rows than there are ranks."""
    first = rows[0] if isinstance(rows, tuple) else rows
    if world == 1 or len(first) < world:
        return rows
    if isinstance(rows, tuple):
        return tuple(r[rank::world] for r in rows)
    return rows[rank::world]


def mean_over_ranks(metrics: dict[str, float], world: int) -> dict[str, float]:
    """Each logged value (a loss of this rank's share of the batch) averaged over the data-parallel
    ranks, so the one run rank 0 logs shows the whole batch's loss. Every rank must call it at
    the same update (the trainers do: ranks step in lockstep)."""
    if world == 1 or not metrics:
        return metrics
    import torch.distributed as dist

    if not dist.is_initialized():
        return metrics
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    keys = sorted(metrics)
    total = torch.tensor([float(metrics[k]) for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(total)
    return {k: v / world for k, v in zip(keys, total.tolist())}


def make_engine(network: torch.nn.Module, lr: float, weight_decay: float, warmup: int, total: int,
                grad_clip: float, deepspeed: str | dict | None = None):
    """A PlainEngine, or a DeepSpeed engine when a DeepSpeed config (path or dict) is given."""
    if deepspeed is None:
        return PlainEngine(network, lr, weight_decay, warmup, total, grad_clip)
    from training.engine.deepspeed_engine import DeepSpeedEngine  # optional dependency, confined there

    return DeepSpeedEngine(network, lr, weight_decay, warmup, total, grad_clip, deepspeed)
