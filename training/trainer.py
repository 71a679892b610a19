"""Interleaved TVM-KA training (TVM-KA paper, Algorithm 1 and section 3.3), resumable.

    1. TVM masked-LM pre-training (DropHead on the shared heads).
    2. For each of ``rounds`` rounds:
         a. TVM masked-LM steps (DropHead on),
         b. refresh the cache of KR(k) with the TVM in eval mode (written to disk; the KA reads
            plain tensors and never holds the TVM graph),
         c. KA task steps on the cached KRs; the KA's shared heads are the TVM's, so these
            steps move the very weights the TVM uses next round,
         d. dev evaluation.
    3. A last refresh with the final TVM; dev picks the binary threshold; dev and test scored.

``mode="no_interleave"`` is the ablation: the TVM trains once (all its MLM steps), one refresh,
then only KA steps (the same number, evaluated at the same points).

The run is a list of phases (:func:`phase_plan`); the trainer's position is (phase, step in
phase, global step). A checkpoint (training.checkpoint) is written at every phase boundary and
every ``checkpoint_every`` global steps; ``resume()`` restores weights, optimizers, schedulers,
every RNG, the MLM batch order and the position, so a resumed run continues exactly where the
saved one stood (same batches, same masks, same dropout).

Choices where the paper is vague:
* TVM:KA steps per round default to 2:1 (``tvm_ka_ratio``). The paper states "2:1 proportion"
  but its example (50K TVM, ~100K KA steps) is 1:2; we follow the stated ratio and make it
  configurable.
* Each network has its own AdamW optimizer (and schedule); the shared parameters are in both,
  so each optimizer keeps its own moments for them.
* The model evaluated and saved is the final one (what gets deployed is what is measured).
* Metric names are the same in every mode: ``train/mlm_loss``, ``train/task_loss``,
  ``dev/<metric>`` (during training), ``final_dev/<metric>`` and ``test/<metric>`` (the final
  model, threshold fitted on dev); the x axis is the global update count, and every
  (metric, step) is logged once.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from seqenc.inference import gather_keys, ka_probabilities, key_representations
from seqenc.model import TVMKA
from seqenc.sequences import TokenizedSequences
from seqenc.tokenizer import ValueTokenizer
from training.checkpoint import Checkpointer, restore_rng, rng_state
from training.data import MLMBatches, class_weights
from training.engines import make_engine
from training.metrics import best_threshold, headline, predict, task_metrics

log = logging.getLogger(__name__)

MODES = ("interleaved", "no_interleave")


@dataclass
class TrainConfig:
    mode: str = "interleaved"
    pretrain_steps: int = 300
    rounds: int = 3
    tvm_steps_per_round: int = 100
    tvm_ka_ratio: float = 2.0  # TVM steps : KA steps in each round
    lr_tvm: float = 5e-4
    lr_ka: float = 5e-4
    weight_decay: float = 0.01
    warmup_steps: int = 50
    grad_clip: float = 1.0
    grad_accum: int = 1  # micro-batches per update
    batch_tokens: int = 8192  # TVM batch size, in padded tokens
    ka_batch_size: int = 32
    seed: int = 0
    log_every: int = 20
    eval_every: int = 0  # KA steps between dev evaluations inside a round (0: once per round)
    checkpoint_every: int = 0  # global steps between checkpoints (0: phase boundaries only)
    deepspeed: str | dict | None = None  # a DeepSpeed config (path or dict): train under DeepSpeed

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r} is not one of {MODES}")

    @property
    def ka_steps_per_round(self) -> int:
        return max(1, round(self.tvm_steps_per_round / self.tvm_ka_ratio))


def phase_plan(cfg: TrainConfig) -> list[tuple[str, int, int]]:
    """``(kind, round, steps)`` for kinds ``tvm``, ``refresh``, ``ka``, ``eval``, ``final``."""
    rounds = range(1, cfg.rounds + 1)
    if cfg.mode == "interleaved":
        plan = [("tvm", 0, cfg.pretrain_steps)]
        for r in rounds:
            plan += [("tvm", r, cfg.tvm_steps_per_round), ("refresh", r, 0), ("ka", r, cfg.ka_steps_per_round),
                     ("eval", r, 0)]
    else:  # no_interleave: every TVM step first, one refresh, then KA only
        plan = [("tvm", 0, cfg.pretrain_steps + cfg.rounds * cfg.tvm_steps_per_round), ("refresh", 1, 0)]
        for r in rounds:
            plan += [("ka", r, cfg.ka_steps_per_round), ("eval", r, 0)]
    return plan + [("final", cfg.rounds + 1, 0)]


class InterleavedTrainer:
    """Runs Algorithm 1 on one task. ``log_metrics(dict, step)`` receives every logged value;
    ``workdir`` holds the KR caches and ``checkpoints/``."""

    def __init__(self, model: TVMKA, tok: ValueTokenizer, data: TokenizedSequences, y: np.ndarray,
                 splits: dict[str, np.ndarray], cfg: TrainConfig, workdir: str | Path,
                 log_metrics=None, progress: bool = True, run_ids: dict | None = None, on_phase_end=None):
        self.model, self.tok, self.data, self.y, self.splits, self.cfg = model, tok, data, y, splits, cfg
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_metrics = log_metrics or (lambda metrics, step: None)
        self.progress = progress
        self.run_ids = run_ids or {}  # stored in checkpoints (MLflow run ids)
        # on_phase_end(index, kind, round, summary): e.g. an MLflow child run per phase
        self.on_phase_end = on_phase_end or (lambda *args: None)
        self._phase_t0 = time.time()
        self.task = model.config.task
        self.plan = phase_plan(cfg)
        self.step = 0  # global update counter across both networks (the MLflow step axis)
        self.phase, self.phase_step, self.kr_version = 0, 0, None
        self.kr: torch.Tensor | None = None
        self.history: dict[str, list[tuple[int, float]]] = defaultdict(list)
        self.checkpoints = Checkpointer(self.workdir / "checkpoints")
        torch.manual_seed(cfg.seed)

        train = data.subset(splits["train"])
        self.mlm = MLMBatches(train.windows, tok, cfg.batch_tokens, cfg.seed)
        n_tvm = sum(n for kind, _, n in self.plan if kind == "tvm")
        n_ka = sum(n for kind, _, n in self.plan if kind == "ka")
        self.engines = {
            "tvm": make_engine(model.tvm, cfg.lr_tvm, cfg.weight_decay, cfg.warmup_steps, n_tvm, cfg.grad_clip,
                               cfg.deepspeed),
            "ka": make_engine(model.ka, cfg.lr_ka, cfg.weight_decay, min(cfg.warmup_steps, n_ka // 4), n_ka,
                              cfg.grad_clip, cfg.deepspeed)}
        self.weights = class_weights(y[splits["train"]], model.config.n_classes)
        self.rng = np.random.default_rng(cfg.seed)

    # --- phases --------------------------------------------------------------------------------
    def tvm_steps(self, steps: int, name: str) -> None:
        for _ in tqdm(range(self.phase_step, steps), desc=name, disable=not self.progress, leave=False):
            self.model.train()
            losses = []
            for _ in range(self.cfg.grad_accum):
                ids, mask, labels = next(self.mlm)
                loss = self.model.tvm.mlm_loss(ids, mask, labels) / self.cfg.grad_accum
                self.engines["tvm"].backward(loss)
                losses.append(loss.item())
            self._update(self.engines["tvm"], {"train/mlm_loss": sum(losses)})

    def refresh_cache(self, version: int) -> None:
        """KR(k) of every key of every sequence, with the TVM in eval mode, via disk."""
        kr = key_representations(self.model.tvm, self.data, self.tok.pad_id, progress=self.progress)
        save_file({"kr": kr.contiguous()}, str(self._cache_path(version)))
        self.kr_version = version
        self.kr = self._load_cache()
        train_rows = np.isin(self.data.key_seq, self.splits["train"])
        self.model.ka.fit_kr_standardisation(self.kr[torch.as_tensor(train_rows)])

    def ka_steps(self, steps: int, round_no: int) -> None:
        offsets, train_idx = self.data.key_rows_of(), self.splits["train"]
        for _ in tqdm(range(self.phase_step, steps), desc="KA task steps", disable=not self.progress, leave=False):
            self.model.train()
            losses = []
            for _ in range(self.cfg.grad_accum):
                batch = self.rng.choice(train_idx, size=min(self.cfg.ka_batch_size, len(train_idx)), replace=False)
                reprs, mask = gather_keys(self.kr, offsets, batch)
                logits = self.model.ka(reprs, mask)
                loss = F.cross_entropy(logits, torch.as_tensor(self.y[batch]), weight=self.weights)
                self.engines["ka"].backward(loss / self.cfg.grad_accum)
                losses.append(loss.item() / self.cfg.grad_accum)
            self._update(self.engines["ka"], {"train/task_loss": sum(losses)},
                         after=lambda: self._maybe_eval(steps, round_no))

    def evaluate(self, threshold: float | None = None) -> dict:
        """Dev (and test) metrics with the cached KRs; the binary threshold is fitted on dev if not given."""
        probs = ka_probabilities(self.model.ka, self.kr, self.data)
        dev = self.splits["dev"]
        if self.task == "binary" and threshold is None:
            threshold = best_threshold(self.y[dev], probs[dev, 1])
        threshold = 0.5 if threshold is None else threshold
        out = {"threshold": threshold, "probs": probs}
        for split in ("dev", "test"):
            idx = self.splits[split]
            out[split] = task_metrics(self.y[idx], predict(probs[idx], self.task, threshold), self.task)
        return out

    # --- Algorithm 1 ---------------------------------------------------------------------------
    def fit(self) -> dict:
        """Run (or, after ``resume``, continue) the plan; returns the final evaluation."""
        cfg, t0 = self.cfg, time.time()
        final = None
        while self.phase < len(self.plan):
            kind, round_no, steps = self.plan[self.phase]
            summary: dict = {}
            if kind == "tvm":
                self.tvm_steps(steps, "TVM pre-training" if round_no == 0 else f"round {round_no}/{cfg.rounds} TVM MLM")
            elif kind == "refresh":
                self.refresh_cache(round_no)
            elif kind == "ka":
                if self.kr is None:
                    self.kr = self._load_cache()
                self.ka_steps(steps, round_no)
            elif kind == "eval":
                summary = {f"dev/{k}": v for k, v in self._log_dev(round_no).items()}
                log.info("round %d/%d: %s", round_no, cfg.rounds, summary)
            else:  # final
                self.refresh_cache(round_no)
                final = self.evaluate()
                summary = {f"final_dev/{k}": v for k, v in final["dev"].items()} | \
                    {f"test/{k}": v for k, v in final["test"].items()}
                self.log_metrics(summary, self.step)
            for key in ("train/mlm_loss", "train/task_loss"):
                if kind in ("tvm", "ka") and self.history[key] and self.history[key][-1][0] > self.step - steps:
                    summary[key] = self.history[key][-1][1]
            self.on_phase_end(self.phase, kind, round_no, summary | {"steps": steps, "end_step": self.step,
                                                                     "seconds": time.time() - self._phase_t0})
            self.phase, self.phase_step, self._phase_t0 = self.phase + 1, 0, time.time()
            if kind != "final":
                self.save_checkpoint()
        final["seconds"] = time.time() - t0
        final["headline"] = headline(self.task)
        final["train_config"] = asdict(cfg)
        return final

    # --- checkpoints ---------------------------------------------------------------------------
    def save_checkpoint(self) -> Path:
        state = {
            "position": {"phase": self.phase, "phase_step": self.phase_step, "step": self.step,
                         "kr_version": self.kr_version},
            "engines": {name: engine.state_dict() for name, engine in self.engines.items()},
            "rng": rng_state({"mlm": self.mlm.generator}, {"mlm": self.mlm.rng, "ka": self.rng}),
            "mlm_order": [int(i) for i in self.mlm._order],
            "history": {k: [list(p) for p in v] for k, v in self.history.items()},
            "run_ids": self.run_ids,
            "train_config": asdict(self.cfg),
        }
        return self.checkpoints.save(self.step, {"model": self.model}, state)

    def resume(self, path: str | Path | None = None) -> bool:
        """Continue from a checkpoint (default: the latest of this workdir); False if none."""
        path = Path(path) if path else self.checkpoints.latest()
        if path is None:
            return False
        state = Checkpointer.load(path, {"model": self.model})
        if state["train_config"] != asdict(self.cfg):
            raise ValueError(f"checkpoint {path} was written with a different train config")
        pos = state["position"]
        self.phase, self.phase_step, self.step, self.kr_version = (pos["phase"], pos["phase_step"], pos["step"],
                                                                   pos["kr_version"])
        for name, engine in self.engines.items():
            engine.load_state_dict(state["engines"][name])
        restore_rng(state["rng"], {"mlm": self.mlm.generator}, {"mlm": self.mlm.rng, "ka": self.rng})
        self.mlm._order = list(state["mlm_order"])
        self.history = defaultdict(list, {k: [tuple(p) for p in v] for k, v in state["history"].items()})
        self.run_ids = state["run_ids"]
        self.kr = None  # reloaded from the cache file when a KA phase needs it
        log.info("resumed from %s at step %d (phase %d, step %d in phase)", path, self.step, self.phase,
                 self.phase_step)
        return True

    # --- helpers -------------------------------------------------------------------------------
    def _cache_path(self, version: int) -> Path:
        return self.workdir / f"kr_cache_v{version}.safetensors"

    def _load_cache(self) -> torch.Tensor:
        return load_file(str(self._cache_path(self.kr_version)))["kr"]

    def _maybe_eval(self, steps: int, round_no: int) -> None:
        """Dev evaluation every ``eval_every`` KA steps inside a round (the round's end has its own)."""
        every = self.cfg.eval_every
        if every and self.phase_step % every == 0 and self.phase_step < steps:
            self._log_dev(round_no)

    def _log_dev(self, round_no: int) -> dict:
        dev = self.evaluate()["dev"]
        self.log_metrics({f"dev/{k}": v for k, v in dev.items()} | {"round": round_no}, self.step)
        return dev

    def _update(self, engine, metrics: dict[str, float], after=None) -> None:
        """One optimizer update from the accumulated gradients; then record its metrics, run
        ``after`` (e.g. a dev evaluation) and checkpoint if due -- in that order, so a checkpoint
        always holds everything its step produced."""
        engine.step()
        self.step += 1
        self.phase_step += 1
        for k, v in metrics.items():
            self.history[k].append((self.step, v))
        if self.step % self.cfg.log_every == 0:
            self.log_metrics(metrics, self.step)
        if after is not None:
            after()
        if self.cfg.checkpoint_every and self.step % self.cfg.checkpoint_every == 0:
            self.save_checkpoint()
