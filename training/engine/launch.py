"""Start N data-parallel ranks of one command on this machine, the way a launcher (torchrun,
deepspeed) starts them: RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and a free MASTER_PORT in each
one's environment. Used by ``seqenc bench train`` and by the tests of several ranks.

With a GPU per rank the ranks use them (NCCL); with fewer GPUs than ranks (a one-GPU machine:
NCCL refuses two ranks on one device) they see none and run on CPU with gloo, as in CI.

Each rank's output goes to a file, not a pipe: a rank blocked on a full pipe while another
waits for it at a barrier would hang both.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class RankResult:
    rank: int
    returncode: int
    stdout: str
    stderr: str


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_ranks(cmd: list[str], world: int, env: dict | None = None, cwd: str | os.PathLike | None = None,
                 timeout: float = 3600) -> list[RankResult]:
    """``cmd`` as ranks 0..world-1 at once, each with this process's environment (less MLFLOW_*
    variables), the launcher's variables and ``env``; waits for all (killing every rank still
    running at ``timeout``: subprocess.TimeoutExpired) and returns each rank's exit code and output."""
    import torch

    port = str(free_port())
    on_cpu = {} if torch.cuda.device_count() >= world else {"CUDA_VISIBLE_DEVICES": "", "DS_ACCELERATOR": "cpu"}
    with tempfile.TemporaryDirectory(prefix="seqenc-ranks-") as tmp:
        workers, files = [], []
        for rank in range(world):
            rank_env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
            rank_env.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                             "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                             "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                             **on_cpu, **(env or {})})
            out, err = Path(tmp, f"rank-{rank}.out").open("w"), Path(tmp, f"rank-{rank}.err").open("w")
            files.append((out, err))
            workers.append(subprocess.Popen(cmd, cwd=cwd, env=rank_env, stdout=out, stderr=err, text=True))
        try:
            deadline = time.monotonic() + timeout
            for worker in workers:
                worker.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            for worker in workers:
                if worker.poll() is None:
                    worker.kill()
                    worker.wait()
            for out, err in files:
                out.close()
                err.close()
        return [RankResult(r, w.returncode, Path(tmp, f"rank-{r}.out").read_text(), Path(tmp, f"rank-{r}.err").read_text())
                for r, w in enumerate(workers)]
