"""One network's optimiser under DeepSpeed (``make_engine(..., deepspeed=CONFIG)``).

:class:`DeepSpeedEngine` has the interface of ``training.engine.engines.PlainEngine`` (``backward``,
``step``, ``state_dict``, ``load_state_dict``) on top of ``deepspeed.initialize``. Everything
DeepSpeed needs (importing it, the accelerator, the process group) is set up here and only here;
the trainer never imports DeepSpeed.

Configuration (a path to a DeepSpeed JSON file, or a dict; never modified in place)
-------------------------------------------------------------------------------------
* ``zero_optimization.stage``: 0, 1 or 2 (see "Shared parameters"); 3 is refused.
* ``optimizer``: default AdamW with the trainer's ``lr`` / ``weight_decay`` (torch's default
  betas/eps, so stage 0 in fp32 is step-for-step the same as PlainEngine); a given optimizer
  without ``lr`` or ``weight_decay`` gets the trainer's (not DeepSpeed's own defaults). For Adam/AdamW
  ``"torch_adam": true`` is the default on every accelerator: torch's optimizer, nothing to
  compile. ``"torch_adam": false`` asks for DeepSpeed's FusedAdam on a GPU, JIT-compiled on first
  use (needs nvcc; measured on an H200 image with DeepSpeed 0.19.8: the build died parsing the
  architecture "9.0a", which is why it is not the default); on CPU it is refused by DeepSpeed.
* ``scheduler``: refused. The schedule is always ``training.engine.schedule.lr_factor`` (warm-up, then
  linear decay), handed to DeepSpeed as a client LambdaLR over its basic optimizer.
* ``gradient_clipping``: ``grad_clip`` unless the config sets it.
* ``train_micro_batch_size_per_gpu``: 1 unless the config sets it (or ``train_batch_size``);
  DeepSpeed only uses it for throughput reports, the trainer builds its own batches.
* ``gradient_accumulation_steps`` must be absent or 1, and ``managed_gradient_accumulation`` is
  forced to false: the trainer accumulates (``TrainConfig.grad_accum`` backward calls, loss
  already divided) and calls ``step()`` once per update, so ``step()`` is the accumulation
  boundary. (Measured: with DeepSpeed's managed mode and gas=1, every backward is a boundary and
  ZeRO-1 with two backward calls per step gives wrong updates.)
* ``fp16`` / ``bf16``: honoured on a GPU for a network that shares no parameter with another
  DeepSpeed engine; on a CPU accelerator they are switched off (with a warning) and the run is
  fp32.

Environment (single process, no launcher)
-----------------------------------------
Before ``import deepspeed``: ``DS_ACCELERATOR=cpu`` when CUDA is unavailable and the variable is
unset (DeepSpeed would otherwise probe and warn). When no launcher variables are present
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` all unset) it sets ``RANK=0 WORLD_SIZE=1 LOCAL_RANK=0
MASTER_ADDR=127.0.0.1`` and a free ``MASTER_PORT`` (without them DeepSpeed tries MPI discovery
and fails without mpi4py), then ``deepspeed.init_distributed(dist_backend="gloo")`` on CPU (the
accelerator's backend, e.g. NCCL, on GPU). Under ``deepspeed``/``torchrun`` the launcher's
variables are used untouched. Any number of engines can live in one process (the trainer makes
two).

Shared parameters (TVM and KA hold the same ``Parameter`` objects) -- what happens
----------------------------------------------------------------------------------------
Measured with DeepSpeed 0.19.8 on CPU in fp32 with torch AdamW: two modules sharing a Linear,
then the TVM-KA itself, stepping either network in turn and comparing with PlainEngine.

* Stage 0, fp32: DeepSpeed's optimizer *is* the torch optimizer over the module's own
  parameters: bit-for-bit PlainEngine when clipping does not trigger (when it does, DeepSpeed's
  clip coefficient can differ in the last bit: it sums squared norms, torch takes a norm of
  norms). Nothing to do.
* Stage 1 and 2, as DeepSpeed does them, are silently wrong with shared parameters:
  - the ZeRO optimizer flattens the parameters into its own buffer (``bit16_groups_flat``, the
    name is kept in fp32), points every ``param.data`` at a view of it, optimises a separate
    fp32 copy of its partition (``single_partition_of_fp32_groups``) and after each step points
    ``param.data`` back into its own buffer. A shared parameter lives in the buffer of whichever
    engine stepped last, and each engine's master copy goes stale when the other one steps: its
    next step starts from the stale copy and discards the other network's updates (max abs
    error ~0.3 after 6 alternating steps of the toy experiment);
  - it keeps per-parameter bookkeeping *on the parameter objects* (``param_idx_in_group``,
    ``_hp_mapping`` and its accessors): for a shared parameter these are the last-created
    engine's, so with 2+ ranks the TVM engine's gradient reduction writes gradients into the
    wrong slots of its partitions (invisible with one rank, where that path is not taken; with
    two ranks, and the fixes below otherwise in place, even TVM-private weights came out wrong
    by ~0.05);
  - it registers gradient hooks on every parameter: in a KA backward the TVM engine's hooks
    fire on the shared parameters too; in stage 2 they reduce those gradients into the *TVM's*
    partitions and DeepSpeed aborts ("The parameter ... has already been reduced").
  Fixed here, so that stages 1 and 2 match PlainEngine (tests/test_deepspeed_engine.py, with one
  process and with two processes each holding half of the optimizer state):
    1. each engine snapshots the attributes its ZeRO optimizer set on the parameters and puts
       them back before its own backward and step (``grad_accum`` excepted: it holds
       accumulating gradients);
    2. before every ``step()`` it copies each parameter's current value into its own view of it
       when ``param.data`` points elsewhere (another engine's buffer), points ``param.data``
       back at that view, then calls ``optimizer.refresh_fp32_params()`` (DeepSpeed's "refresh
       the fp32 master from the model weights"). In fp32 the master equals the weights, so this
       is exact, and weights loaded into the model later (a resumed checkpoint) take effect.
       Every rank holds the full weights in stages 1/2 and refreshes its own partition;
    3. gradient-hook ownership: before a backward, the ZeRO gradient hooks of every engine that
       shares parameters with this one are removed (``optimizer._grad_acc_hooks``) and this
       engine's are re-created (``optimizer.create_gradient_handling_hooks()``), so only the
       network that runs the backward sees its gradients;
    4. ``optimizer.clear_backward_seen_flag()`` before each backward (DeepSpeed calls it in
       ``engine.forward``, which the trainer bypasses: it calls the networks' own methods).
  These use DeepSpeed internals (checked at construction: a version without them is refused
  with a ValueError). The remaining differences from PlainEngine are rounding (the flat buffer
  changes memory alignment, hence matmul rounding) -- except for the attention *key biases*,
  whose gradient is mathematically zero, so Adam turns their rounding noise into lr-sized steps
  in any implementation; they have no effect on any output.
* Stage 3: refused (``ValueError``). ZeRO-3 partitions the weights themselves and gathers them
  only inside the forward of the module its engine wraps; a shared head would be partitioned by
  two engines, and the trainer uses weights outside a forward (the MLM decoder is tied to the
  word embeddings and read in ``mlm_logits``).
* fp16/bf16 with shared parameters: refused (``ValueError``). DeepSpeed's mixed-precision
  optimizers keep fp32 master weights; the stale-master problem is the same, but re-reading the
  master from the 16-bit weights before every step would throw away the master precision.
  Without sharing (e.g. ``n_shared_heads=0``) mixed precision is DeepSpeed's own business.

Checkpoint state (``state_dict``): plain nested dicts/lists of tensors and scalars
--------------------------------------------------------------------------------
``{"zero_stage", "world_size", "rank", "optimizer": <basic torch optimizer state_dict>,
"scheduler": <LambdaLR state_dict>, "counters": {global_steps, global_samples, micro_steps,
skipped_steps}}`` plus, only with fp16/bf16, ``"master"`` (the fp32 master tensors) and
``"loss_scale"`` (the loss scaler's scalars). For stage 0 the basic optimizer is the optimizer;
for stages 1/2 its state is *this rank's partition* (flat exp_avg/exp_avg_sq), so a resume needs
the same world size and rank (checked) and every rank must save and load its own state. In fp32
the master copy is not saved: fix 2 above rebuilds it from the weights the trainer restores.
The mixed-precision entries were exercised on CPU with bf16 forced on (DeepSpeed's CPU
accelerator runs bf16; stages 0-2 resume exactly); fp16 (dynamic loss scaling) and the CUDA
optimizers (FusedAdam, FP16_Optimizer) are untested here, having no GPU.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import socket
import sys
import weakref
from pathlib import Path

import torch

from training.engine.schedule import lr_factor

log = logging.getLogger(__name__)

_LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
_COUNTERS = ("global_steps", "global_samples", "micro_steps", "skipped_steps")
# where DeepSpeed's optimizers keep fp32 master weights: ZeRO-1/2, BF16_Optimizer, FP16_Optimizer,
# FP16_UnfusedOptimizer (a list of lists)
_MASTER_ATTRS = ("single_partition_of_fp32_groups", "fp32_groups_flat_partition", "fp32_groups_flat", "fp32_groups")
# the ZeRO-1/2 internals the shared-parameter handling relies on (DeepSpeed 0.19)
_ZERO_API = ("refresh_fp32_params", "create_gradient_handling_hooks", "clear_backward_seen_flag", "_grad_acc_hooks")

_LIVE: weakref.WeakSet[DeepSpeedEngine] = weakref.WeakSet()  # every engine of this process


# --- environment ------------------------------------------------------------------------------
def import_deepspeed():
    """``import deepspeed`` with the accelerator pinned to CPU when there is no CUDA."""
    if "DS_ACCELERATOR" not in os.environ and not torch.cuda.is_available():
        os.environ["DS_ACCELERATOR"] = "cpu"
    import deepspeed

    return deepspeed


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _accelerator_is_cpu() -> bool:
    from deepspeed.accelerator import get_accelerator

    return get_accelerator().device_name() == "cpu"


def init_distributed() -> None:
    """The process group DeepSpeed needs; a one-process group when no launcher set one up."""
    deepspeed = import_deepspeed()
    from deepspeed.accelerator import get_accelerator

    if not torch.distributed.is_initialized() and not any(v in os.environ for v in _LAUNCHER_VARS):
        os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"})
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        log.info("no launcher environment: single-process group on %s:%s", os.environ["MASTER_ADDR"],
                 os.environ["MASTER_PORT"])
    backend = "gloo" if _accelerator_is_cpu() else get_accelerator().communication_backend_name()
    deepspeed.init_distributed(dist_backend=backend)  # a no-op when already initialised


def barrier() -> None:
    """Wait for every rank (setting up the process group first when needed)."""
    init_distributed()
    torch.distributed.barrier()


def finish_distributed() -> bool:
    """Leave the process group together: a barrier, then its teardown. Without it the first rank to
    exit closes its connections while another still tears its own down, and gloo's background
    thread in that one can abort the process (seen as exit -6 of a rank whose job was done).
    True when this process was one rank of several (the caller then leaves with :func:`exit_rank`)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        several = torch.distributed.get_world_size() > 1
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
        return several
    return False


def exit_rank(code: int = 0) -> None:
    """End a data-parallel rank whose work is done and whose group is torn down
    (:func:`finish_distributed`), without the interpreter's teardown: output flushed, then
    ``os._exit``. Why: even after the barrier and the teardown, a rank of ``seqenc bench train``
    once aborted at exit in a full CI run ("terminate called without an active exception", exit
    -6, after its last log line; not reproduced in 14 runs of that test alone, 8 of them 4 side by
    side): what C++ prints when a thread still joinable is destroyed, here with the process's
    static objects. Nothing is left to run at that point: rank 0 has closed its MLflow run and
    written the bundle, and the result is printed and flushed."""
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


# --- configuration ----------------------------------------------------------------------------
def _load_config(config: str | Path | dict) -> dict:
    if isinstance(config, dict):
        return copy.deepcopy(config)
    return json.loads(Path(config).read_text())


def zero_stage(cfg: dict) -> int:
    zero = cfg.get("zero_optimization", {})
    if isinstance(zero, bool):  # DeepSpeed's legacy spelling: true means stage 1
        return int(zero)
    return int(zero.get("stage", 0))


def _mixed_precision(cfg: dict) -> bool:
    return any(isinstance(cfg.get(k), dict) and cfg[k].get("enabled", False) for k in ("fp16", "bf16", "bfloat16"))


def build_config(config: str | Path | dict, lr: float, weight_decay: float, grad_clip: float,
                 on_cpu: bool) -> dict:
    """The DeepSpeed config this engine runs with (see the module docstring)."""
    cfg = _load_config(config)
    if "scheduler" in cfg:
        raise ValueError("the DeepSpeed config sets a 'scheduler'; the learning-rate schedule comes from the "
                         "TrainConfig (warm-up, then linear decay): remove 'scheduler' from the config")
    if cfg.get("gradient_accumulation_steps", 1) != 1:
        raise ValueError("the DeepSpeed config sets gradient_accumulation_steps="
                         f"{cfg['gradient_accumulation_steps']}; the trainer accumulates gradients itself: "
                         "set TrainConfig.grad_accum instead and leave it out of the DeepSpeed config")
    if cfg.get("managed_gradient_accumulation", False):
        raise ValueError("managed_gradient_accumulation=true is not supported: every step() of the trainer is "
                         "an accumulation boundary")
    cfg["gradient_accumulation_steps"] = 1
    cfg["managed_gradient_accumulation"] = False
    if "train_micro_batch_size_per_gpu" not in cfg and "train_batch_size" not in cfg:
        cfg["train_micro_batch_size_per_gpu"] = 1
    cfg.setdefault("gradient_clipping", grad_clip)
    if "optimizer" not in cfg:
        cfg["optimizer"] = {"type": "AdamW", "params": {"lr": lr, "weight_decay": weight_decay}}
    opt = cfg["optimizer"]
    # an optimizer without lr / weight_decay would take DeepSpeed's own defaults, silently not the
    # TrainConfig's (lr_tvm, lr_ka): the config's values win only where it gives them
    opt.setdefault("params", {}).setdefault("lr", lr)
    opt["params"].setdefault("weight_decay", weight_decay)
    if str(opt.get("type", "")).lower() in ("adam", "adamw"):
        opt.setdefault("params", {}).setdefault("torch_adam", True)  # FusedAdam: opt-in (module docstring)
    if on_cpu and _mixed_precision(cfg):
        log.warning("DeepSpeed runs on CPU: fp16/bf16 from the config are switched off, training in fp32")
        for key in ("fp16", "bf16", "bfloat16"):
            if isinstance(cfg.get(key), dict):
                cfg[key] = {**cfg[key], "enabled": False}
    return cfg


# --- the engine -------------------------------------------------------------------------------
class DeepSpeedEngine:
    """``PlainEngine``'s interface (backward, step, state_dict, load_state_dict) under DeepSpeed.

    ``deepspeed_config`` is a path to a DeepSpeed JSON file or a dict. Engines whose networks
    share parameters (the TVM and the KA) find each other through a process-wide registry and
    keep the shared parameters consistent (module docstring)."""

    def __init__(self, network: torch.nn.Module, lr: float, weight_decay: float, warmup: int, total: int,
                 grad_clip: float, deepspeed_config: str | Path | dict):
        deepspeed = import_deepspeed()
        init_distributed()
        self.network = network
        self.config = build_config(deepspeed_config, lr, weight_decay, grad_clip, _accelerator_is_cpu())
        self.zero_stage = zero_stage(self.config)
        self.mixed_precision = _mixed_precision(self.config)
        if self.zero_stage >= 3:
            raise ValueError(
                "ZeRO stage 3 is not supported: it partitions the weights themselves and gathers them only in "
                "the forward of the module its engine wraps, but the TVM and the KA share attention heads "
                "(one parameter would be partitioned by two engines) and the trainer reads weights outside a "
                "forward (the MLM decoder tied to the word embeddings); use stage 0, 1 or 2")
        if self.zero_stage not in (0, 1, 2):
            raise ValueError(f"unknown ZeRO stage {self.zero_stage}")
        self.params = [p for p in network.parameters() if p.requires_grad]
        ids = {id(p) for p in self.params}
        peers = [e for e in list(_LIVE) if any(id(p) in ids for p in e.params)]
        if peers and self.mixed_precision:
            raise ValueError(
                "fp16/bf16 under DeepSpeed is not supported for networks that share parameters (the TVM-KA "
                "shared attention heads): DeepSpeed's mixed-precision optimizers keep their own fp32 master "
                "weights, so one network's updates of a shared head would be overwritten by the other's stale "
                "master copy; train in fp32 (drop fp16/bf16 from the DeepSpeed config)")

        def scheduler(optimizer):
            return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, warmup, total))

        before = [dict(vars(p)) for p in self.params]
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=network, model_parameters=self.params, config=self.config, lr_scheduler=scheduler)
        # the attributes ZeRO keeps *on the parameters* (param_idx_in_group, _hp_mapping, ...): a
        # shared parameter carries those of the engine created last, so each engine puts its own
        # back before it touches gradients (grad_accum is left alone: it holds accumulating grads)
        self._param_attrs = [(p, attrs) for p, b in zip(self.params, before)
                             if (attrs := {k: v for k, v in vars(p).items()
                                           if k != "grad_accum" and (k not in b or b[k] is not v)})]
        self.basic_optimizer = self.engine.basic_optimizer
        self._zero = self.zero_stage in (1, 2)
        if self._zero:
            missing = [a for a in _ZERO_API if not hasattr(self.optimizer, a)]
            if missing:
                raise ValueError(f"this DeepSpeed version's ZeRO optimizer lacks {missing}, which keeping shared "
                                 f"TVM/KA parameters consistent needs; use ZeRO stage 0")
        # each engine's own view of every parameter (ZeRO-1/2: a slice of its flat buffer), taken
        # before another engine can re-point a shared parameter into its buffer
        self._homes = [(p, p.data) for p in self.params] if self._zero and not self.mixed_precision else []
        self._hooks_attached = True
        self._peers: weakref.WeakSet[DeepSpeedEngine] = weakref.WeakSet(peers)
        for peer in peers:
            peer._peers.add(self)
        _LIVE.add(self)
        in_peers = {id(q) for e in peers for q in e.params}
        log.info("DeepSpeed engine for %s: ZeRO stage %d, %s, %s on %s, world size %d, %d parameters "
                 "(%d shared with engines made before it)", type(network).__name__, self.zero_stage,
                 "mixed precision" if self.mixed_precision else "fp32", type(self.basic_optimizer).__name__,
                 self.params[0].device if self.params else "-", self.engine.world_size,
                 sum(p.numel() for p in self.params), sum(p.numel() for p in self.params if id(p) in in_peers))

    # --- where this process stands ---------------------------------------------------------
    @property
    def rank(self) -> int:
        return int(self.engine.global_rank)

    @property
    def world_size(self) -> int:
        return int(self.engine.world_size)

    @property
    def device(self) -> torch.device:
        return torch.device(self.engine.device)

    # --- training ------------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor) -> None:
        self._restore_param_attrs()
        if self._zero:
            for peer in list(self._peers):
                peer._detach_grad_hooks()
            self._attach_grad_hooks()
            self.optimizer.clear_backward_seen_flag()
        self.engine.backward(loss)

    def step(self) -> None:
        """Clip, optimizer step, schedule step, zero the gradients (DeepSpeed does all four)."""
        self._restore_param_attrs()
        if self._homes:
            self._sync_master_from_weights()
        self.engine.step()

    def _restore_param_attrs(self) -> None:
        for p, attrs in self._param_attrs:
            p.__dict__.update(attrs)

    def _sync_master_from_weights(self) -> None:
        """Bring this engine's flat buffer and fp32 master up to the parameters' current values,
        which another engine (a shared head) or a checkpoint load may have changed."""
        with torch.no_grad():
            for p, home in self._homes:
                if p.data.data_ptr() != home.data_ptr():
                    home.copy_(p.data)
                    p.data = home
        self.optimizer.refresh_fp32_params()

    def _detach_grad_hooks(self) -> None:
        if self._zero and self._hooks_attached:
            for hook in self.optimizer._grad_acc_hooks:
                hook.remove()
            self.optimizer._grad_acc_hooks.clear()
            self._hooks_attached = False

    def _attach_grad_hooks(self) -> None:
        if self._zero and not self._hooks_attached:
            self.optimizer.create_gradient_handling_hooks()
            self._hooks_attached = True

    # --- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict:
        state = {"zero_stage": self.zero_stage, "world_size": self.world_size, "rank": self.rank,
                 "optimizer": self.basic_optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                 "counters": {k: int(getattr(self.engine, k)) for k in _COUNTERS}}
        if self.mixed_precision:
            state["master"] = [t.detach().clone() for t in self._master_tensors()]
            scaler = self._loss_scaler()
            if scaler is not None:
                state["loss_scale"] = {k: v for k, v in vars(scaler).items() if isinstance(v, (bool, int, float))}
        return state

    def load_state_dict(self, state: dict) -> None:
        checks = [("zero_stage", self.zero_stage), ("world_size", self.world_size)]
        if self._zero:  # each rank holds its own partition of the optimizer state
            checks.append(("rank", self.rank))
        for key, mine in checks:
            if state[key] != mine:
                raise ValueError(f"engine state was saved with {key}={state[key]}, this run has {key}={mine}")
        self.basic_optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        for k, v in state["counters"].items():
            setattr(self.engine, k, v)
        if self.mixed_precision:
            with torch.no_grad():
                for mine, saved in zip(self._master_tensors(), state["master"], strict=True):
                    mine.copy_(saved)
            scaler = self._loss_scaler()
            for k, v in state.get("loss_scale", {}).items():
                setattr(scaler, k, v)

    def _master_tensors(self) -> list[torch.Tensor]:
        for attr in _MASTER_ATTRS:
            if hasattr(self.optimizer, attr):
                groups = getattr(self.optimizer, attr)
                return [t for g in groups for t in (g if isinstance(g, (list, tuple)) else [g])]
        return []

    def _loss_scaler(self):
        return getattr(self.optimizer, "loss_scaler", None) or getattr(self.optimizer, "loss_scale_config", None)

    # --- teardown ------------------------------------------------------------------------------
    def close(self) -> None:
        """Leave the registry and release DeepSpeed's hooks and buffers. Also done (without
        DeepSpeed's ``destroy``) when the engine is garbage-collected, so that a dropped engine's
        ZeRO gradient hooks never fire on parameters that live on in another engine."""
        self._release()
        self.engine.destroy()

    def _release(self) -> None:
        _LIVE.discard(self)
        for peer in list(self._peers):
            peer._peers.discard(self)
        self._detach_grad_hooks()
        for handle in ("module_forward_pre_hook", "module_forward_post_hook"):
            if getattr(self.engine, handle, None) is not None:
                getattr(self.engine, handle).remove()
                setattr(self.engine, handle, None)

    def __del__(self):
        try:
            if hasattr(self, "engine"):
                self._release()
        except Exception:  # interpreter shutdown, half-built engine: nothing left to protect
            pass
