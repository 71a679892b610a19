"""Run a command as N data-parallel ranks on this machine (training.engine.launch: the variables
torchrun sets, a free MASTER_PORT, gloo on CPU where there is not a GPU per rank)."""

from __future__ import annotations

from training.engine.launch import launch_ranks


def run_ranks(cmd: list[str], cwd, world: int = 2, timeout: float = 600, env: dict | None = None) -> list[str]:
    """Run ``cmd`` as ranks 0..world-1 at once; returns their outputs (stdout, then stderr) after
    asserting that every one exited 0. MLFLOW_* variables of this process are not passed on."""
    results = launch_ranks(cmd, world, env=env, cwd=cwd, timeout=timeout)
    for r in results:
        assert r.returncode == 0, f"rank {r.rank} failed:\n{(r.stdout + r.stderr)[-5000:]}"
    return [r.stdout + r.stderr for r in results]
