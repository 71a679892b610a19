"""The learning-rate schedule every engine uses (plain PyTorch and DeepSpeed alike)."""

from __future__ import annotations


def lr_factor(step: int, warmup: int, total: int) -> float:
    """Linear warm-up over ``warmup`` steps, then linear decay to a floor of 0.1 at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    return max(0.1, 1.0 - 0.9 * (step - warmup) / max(1, total - warmup))
