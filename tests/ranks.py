"""Start N data-parallel worker processes the way a launcher (torchrun, deepspeed) starts them:
RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and a free MASTER_PORT in each one's environment.

With a GPU per rank the workers use them (NCCL); with fewer GPUs than ranks (a one-GPU machine:
NCCL refuses two ranks on one device) the workers see none and run on CPU with gloo, as in CI."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(cmd: list[str], cwd, world: int = 2, timeout: float = 600, env: dict | None = None) -> list[str]:
    """Run ``cmd`` as ranks 0..world-1 at once; returns their outputs (stdout + stderr) after
    asserting that every one exited 0. MLFLOW_* variables of this process are not passed on."""
    port = str(free_port())
    import torch

    on_cpu = {} if torch.cuda.device_count() >= world else {"CUDA_VISIBLE_DEVICES": "", "DS_ACCELERATOR": "cpu"}
    workers, logs = [], []
    for rank in range(world):
        worker_env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
        worker_env.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                           **on_cpu, **(env or {})})
        log = (Path(cwd) / f".rank-{rank}-of-{world}-{port}.log").open("w+")  # a file, not a pipe: a rank
        logs.append(log)  # blocked on a full pipe while another waits for it at a barrier would hang both
        workers.append(subprocess.Popen(cmd, cwd=cwd, env=worker_env, stdout=log, stderr=subprocess.STDOUT, text=True))
    outputs = []
    deadline = time.monotonic() + timeout
    try:
        for worker in workers:
            worker.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        for log in logs:
            log.seek(0)
            outputs.append(log.read())
            log.close()
            Path(log.name).unlink()
    for rank, (worker, out) in enumerate(zip(workers, outputs)):
        assert worker.returncode == 0, f"rank {rank} failed:\n{out[-5000:]}"
    return outputs
