"""Training checkpoints: everything an exact resume needs, and no pickles.

A checkpoint is a directory ``<job>/checkpoints/step-<global step>/``::

    weights.safetensors   every network of the job (state_dict keys prefixed by its name)
    tensors.safetensors   the tensors of optimizer states and RNG states
    state.json            the rest: where training stands (phase, step in phase, global step),
                          optimizer and scheduler scalars, numpy RNG states, the KR cache version,
                          the MLflow run ids, the train config

Nested states (``optimizer.state_dict()``, RNG states) are split into their tensors, stored in
safetensors, and a JSON skeleton that says where each tensor goes back. So loading a checkpoint
never runs ``pickle`` (a checkpoint from elsewhere cannot execute code).

Writes are atomic: the directory is written under a temporary name and renamed, then the
``latest`` pointer file is replaced; a crash leaves the previous checkpoint in place. The last
``keep`` checkpoints are kept.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

log = logging.getLogger(__name__)


# --- nested states <-> (tensors, JSON skeleton) -----------------------------------------------
def split_tensors(obj, tensors: dict[str, torch.Tensor], prefix: str):
    """Replace every tensor in a nested dict/list by a reference; tensors go into ``tensors``."""
    if isinstance(obj, torch.Tensor):
        tensors[prefix] = obj.detach().cpu().contiguous()
        return {"__tensor__": prefix}
    if isinstance(obj, dict):
        return {"__dict__": [[k, split_tensors(v, tensors, f"{prefix}.{k}")] for k, v in obj.items()]}
    if isinstance(obj, (list, tuple)):
        items = [split_tensors(v, tensors, f"{prefix}.{i}") for i, v in enumerate(obj)]
        return {"__tuple__": items} if isinstance(obj, tuple) else items
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"cannot checkpoint a {type(obj).__name__} at {prefix}")


def join_tensors(skeleton, tensors: dict[str, torch.Tensor]):
    """Inverse of :func:`split_tensors`."""
    if isinstance(skeleton, dict):
        if "__tensor__" in skeleton:
            return tensors[skeleton["__tensor__"]]
        if "__tuple__" in skeleton:
            return tuple(join_tensors(v, tensors) for v in skeleton["__tuple__"])
        return {k: join_tensors(v, tensors) for k, v in skeleton["__dict__"]}
    if isinstance(skeleton, list):
        return [join_tensors(v, tensors) for v in skeleton]
    return skeleton


# --- RNG states -------------------------------------------------------------------------------
def rng_state(generators: dict[str, torch.Generator], numpy_rngs: dict[str, np.random.Generator]) -> dict:
    state = {"torch": torch.get_rng_state(),
             "generators": {name: g.get_state() for name, g in generators.items()},
             "numpy": {name: r.bit_generator.state for name, r in numpy_rngs.items()}}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict, generators: dict[str, torch.Generator], numpy_rngs: dict[str, np.random.Generator]):
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    for name, g in generators.items():
        g.set_state(state["generators"][name])
    for name, r in numpy_rngs.items():
        r.bit_generator.state = state["numpy"][name]


# --- checkpoint directories -------------------------------------------------------------------
class Checkpointer:
    """Saves and finds the checkpoints of one job under ``<directory>``."""

    def __init__(self, directory: str | Path, keep: int = 2):
        self.dir, self.keep = Path(directory), keep

    def save(self, step: int, networks: dict[str, torch.nn.Module], state: dict) -> Path:
        """``state`` may hold tensors anywhere (optimizer/scheduler/RNG states)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        final = self.dir / f"step-{step:09d}"
        tmp = self.dir / f".tmp-step-{step:09d}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        weights = {f"{name}.{k}": v.detach().cpu().contiguous()
                   for name, net in networks.items() for k, v in net.state_dict().items()}
        save_file(_untie(weights), str(tmp / "weights.safetensors"))
        tensors: dict[str, torch.Tensor] = {}
        skeleton = split_tensors(state, tensors, "state")
        save_file(tensors, str(tmp / "tensors.safetensors"))
        (tmp / "state.json").write_text(json.dumps(skeleton, indent=1))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        pointer = self.dir / ".latest.tmp"
        pointer.write_text(final.name)
        os.replace(pointer, self.dir / "latest")
        for old in sorted(self.dir.glob("step-*"))[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        log.info("checkpoint %s", final)
        return final

    def latest(self) -> Path | None:
        pointer = self.dir / "latest"
        if not pointer.exists():
            return None
        path = self.dir / pointer.read_text().strip()
        return path if path.exists() else None

    @staticmethod
    def load(path: str | Path, networks: dict[str, torch.nn.Module]) -> dict:
        """Load the weights into ``networks`` (strict) and return the state."""
        path = Path(path)
        weights = load_file(str(path / "weights.safetensors"))
        for name, net in networks.items():
            own = {k[len(name) + 1:]: v for k, v in weights.items() if k.startswith(f"{name}.")}
            net.load_state_dict(own, strict=True)
        tensors = load_file(str(path / "tensors.safetensors"))
        return join_tensors(json.loads((path / "state.json").read_text()), tensors)


def _untie(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors refuses tensors that share memory (tied or shared weights): copy repeats."""
    seen: set[int] = set()
    out = {}
    for k, v in weights.items():
        ptr = v.untyped_storage().data_ptr()
        out[k] = v.clone() if ptr in seen else v
        seen.add(ptr)
    return out
