"""What every trainer shares: a plan of phases, the position in it, updates, checkpoints, resume.

A run is a list of phases ``(kind, round, steps)``; the trainer's position is (phase, step in
phase, global step). A checkpoint (training.engine.checkpoint) is written at every phase boundary and
every ``checkpoint_every`` global steps; :meth:`PhasedTrainer.resume` restores weights, the
engines (optimizer + schedule), every RNG, the subclass's extra state (e.g. the MLM batch order)
and the position, so a resumed run continues exactly where the saved one stood.

Subclasses define the phases (:meth:`run_phase`), which networks the engines train, and their
RNG sources. With ``keep_best`` (end-to-end modes) every dev evaluation whose headline metric
beats the best so far keeps a copy of the weights (in the checkpoints too), and the final phase
evaluates, and the run saves, those weights. Metric names are the same in every mode:
``train/mlm_loss``, ``train/task_loss``, ``dev/<metric>`` (during training), ``final_dev/<metric>``
and ``test/<metric>`` (the final model, binary threshold fitted on dev); the x axis is the global
update count, and every (metric, step) is logged once.
"""

from __future__ import annotations

import logging
import resource
import time
from collections import defaultdict
from dataclasses import MISSING, asdict, fields
from pathlib import Path

import numpy as np
import torch

from training.engine.checkpoint import Checkpointer, restore_rng, rng_state
from training.engine.collectives import gather_work
from training.engine.engines import data_parallel, mean_over_ranks, training_device
from training.tasks.metrics import headline, split_metrics
from training.tasks.thresholds import fit_threshold

log = logging.getLogger(__name__)


WORK_COUNTS = ("mlm_rows", "ka_rows", "refreshes", "refresh_windows", "refresh_tokens", "refresh_encode_seconds",
               "refresh_seconds", "surprise_sequences", "surprise_seconds",
               "task_rows", "eval_rows")  # the end-to-end trainers' batch rows and evaluation forward passes

# train config fields a resumed run may change: where it runs is not what it computes
RESUMABLE_CHANGES = ("device",)


def same_run(saved: dict, cfg) -> bool:
    """Whether a checkpoint's train config is the one of ``cfg`` (a dataclass): equal but for
    RESUMABLE_CHANGES; a field the checkpoint predates counts as that field's default."""
    for f in fields(cfg):
        if f.name not in saved and f.default is not MISSING:
            saved = saved | {f.name: f.default}
    current = asdict(cfg)
    return set(saved) == set(current) and all(saved[k] == v for k, v in current.items()
                                              if k not in RESUMABLE_CHANGES)


class PhasedTrainer:
    """``log_metrics(dict, step)`` receives every logged value; ``on_phase_end(index, kind,
    round, summary)`` is called after each phase (e.g. an MLflow child run); ``workdir`` holds
    ``checkpoints/`` and any caches."""

    def __init__(self, model: torch.nn.Module, y: np.ndarray, splits: dict[str, np.ndarray], cfg, workdir,
                 task: str, plan: list[tuple[str, int, int]], log_metrics=None, progress: bool = True,
                 run_ids: dict | None = None, on_phase_end=None):
        self.model, self.y, self.splits, self.cfg, self.task, self.plan = model, y, splits, cfg, task, plan
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_metrics = log_metrics or (lambda metrics, step: None)
        self.on_phase_end = on_phase_end or (lambda *args: None)
        self.progress = progress
        self.run_ids = run_ids or {}  # stored in checkpoints (MLflow run ids)
        self.step = 0  # global update counter across networks (the MLflow step axis)
        self.phase = self.phase_step = 0
        self.history: dict[str, list[tuple[int, float]]] = defaultdict(list)
        self.best: dict | None = None  # keep_best: {"step", "score", "weights"} of the best dev evaluation
        self.rank, self.world = data_parallel(cfg.deepspeed)  # (0, 1) without DeepSpeed
        # what this rank computed (training.engine.sharding): rows of batches it read, distinct
        # windows and tokens it encoded in KR refreshes, sequences it scored for the surprise, and seconds
        self.work: dict[str, float] = dict.fromkeys(WORK_COUNTS, 0)
        if cfg.deepspeed is None:
            model.to(training_device(cfg.device))  # before the engines: their optimizers hold these parameters
        elif cfg.device != "auto":
            raise ValueError(f"device={cfg.device!r}: under DeepSpeed the accelerator of each rank decides "
                             "(set DS_ACCELERATOR / the launcher's devices); leave device at 'auto'")
        ckpt_dir = self.workdir / "checkpoints"
        self.checkpoints = Checkpointer(ckpt_dir / f"rank-{self.rank}" if self.world > 1 else ckpt_dir)
        self.engines: dict = {}  # name -> engine (training.engine.engines), set by the subclass
        self._phase_t0 = time.time()
        torch.manual_seed(cfg.seed)

    # --- to define in a subclass ----------------------------------------------------------------
    def run_phase(self, kind: str, round_no: int, steps: int) -> dict | None:
        """Run (the rest of) one phase; return its summary metrics. ``final`` returns the result."""
        raise NotImplementedError

    def probabilities(self) -> np.ndarray:
        """Class probabilities of every sequence [N, C] with the current model."""
        raise NotImplementedError

    def rng_sources(self) -> tuple[dict[str, torch.Generator], dict[str, np.random.Generator]]:
        return {}, {}

    def extra_state(self) -> dict:
        return {}

    def load_extra_state(self, state: dict) -> None:
        pass

    # --- the loop ------------------------------------------------------------------------------
    def fit(self) -> dict:
        """Run (or, after ``resume``, continue) the plan; returns the final evaluation."""
        t0, final = time.time(), None
        while self.phase < len(self.plan):
            kind, round_no, steps = self.plan[self.phase]
            if kind == "final" and self.best is not None:
                self.model.load_state_dict(self.best["weights"])
                log.info("final model: the weights of the best dev evaluation (step %d, dev %s %.4f)",
                         self.best["step"], headline(self.task), self.best["score"])
            summary = self.run_phase(kind, round_no, steps) or {}
            if kind == "final":
                final, summary = summary, {f"final_dev/{k}": v for k, v in summary["dev"].items()} | \
                    {f"test/{k}": v for k, v in summary["test"].items()}
                self.log_metrics(summary, self.step)
                log.info("final model: %s", summary)
            for key in ("train/mlm_loss", "train/task_loss"):
                if steps and self.history[key] and self.history[key][-1][0] > self.step - steps:
                    summary[key] = self.history[key][-1][1]
            self.on_phase_end(self.phase, kind, round_no, summary | {"steps": steps, "end_step": self.step,
                                                                     "seconds": time.time() - self._phase_t0})
            self.phase, self.phase_step, self._phase_t0 = self.phase + 1, 0, time.time()
            if kind != "final":
                self.save_checkpoint()
        final["seconds"] = time.time() - t0
        peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
        final["data_parallel"] = gather_work(self.work | {"fit_seconds": final["seconds"], "peak_rss_mb": peak_rss_mb},
                                             self.rank, self.world)
        final["best_step"] = self.best["step"] if self.best is not None else None  # keep_best
        final["headline"] = headline(self.task)
        final["train_config"] = asdict(self.cfg)
        return final

    def evaluate(self, threshold: float | None = None, splits: tuple[str, ...] = ("dev", "test")) -> dict:
        """Metrics of ``splits`` (dev first); the binary threshold is fitted on dev if not given,
        by the config's ``threshold_rule`` (training.tasks.thresholds)."""
        probs = self.split_probabilities(splits)
        dev = self.splits["dev"]
        if self.task == "binary" and threshold is None:
            threshold = fit_threshold(self.cfg.threshold_rule, self.y[dev], probs[dev, 1], self.threshold_pivot())
        threshold = 0.5 if threshold is None else threshold
        out = {"threshold": threshold, "probs": probs}
        for split in splits:
            idx = self.splits[split]
            out[split] = split_metrics(self.y[idx], probs[idx], self.task, threshold)
        return out

    def threshold_pivot(self) -> float | None:
        """The score's own decision, where a threshold rule pivots (training.tasks.thresholds):
        0.5 for a model's probability; a subclass whose score has none returns None."""
        return 0.5

    def split_probabilities(self, splits: tuple[str, ...]) -> np.ndarray:
        """[n_sequences, n_outputs] probabilities, read at the rows of ``splits``: every row here;
        a subclass whose forward pass is costly computes only those (others NaN)."""
        return self.probabilities()

    def log_dev(self, round_no: int) -> dict:
        dev = self.evaluate(splits=("dev",))["dev"]
        self.log_metrics({f"dev/{k}": v for k, v in dev.items()} | {"round": round_no}, self.step)
        score = dev[headline(self.task)]
        if self.cfg.keep_best and (self.best is None or score > self.best["score"]):  # ties keep the earlier
            self.best = {"step": self.step, "score": float(score),
                         "weights": {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}}
        return {f"dev/{k}": v for k, v in dev.items()}

    def maybe_eval(self, steps: int, round_no: int) -> None:
        """Dev evaluation every ``eval_every`` steps inside a phase (the round's end has its own)."""
        every = self.cfg.eval_every
        if every and self.phase_step % every == 0 and self.phase_step < steps:
            self.log_dev(round_no)

    def update(self, engine, metrics: dict[str, float], after=None) -> None:
        """One update from the accumulated gradients; then record its metrics, run ``after`` (e.g.
        a dev evaluation) and checkpoint if due -- in that order, so a checkpoint always holds
        everything its step produced."""
        engine.step()
        self.step += 1
        self.phase_step += 1
        metrics = mean_over_ranks(metrics, self.world)
        for k, v in metrics.items():
            self.history[k].append((self.step, v))
        if self.step % self.cfg.log_every == 0:
            self.log_metrics(metrics, self.step)
        if after is not None:
            after()
        if self.cfg.checkpoint_every and self.step % self.cfg.checkpoint_every == 0:
            self.save_checkpoint()

    # --- checkpoints ---------------------------------------------------------------------------
    def save_checkpoint(self) -> Path:
        state = {
            "position": {"phase": self.phase, "phase_step": self.phase_step, "step": self.step},
            "engines": {name: engine.state_dict() for name, engine in self.engines.items()},
            "rng": rng_state(*self.rng_sources()),
            "extra": self.extra_state(),
            "history": {k: [list(p) for p in v] for k, v in self.history.items()},
            "run_ids": self.run_ids,
            "train_config": asdict(self.cfg),
            "best": self.best,
        }
        return self.checkpoints.save(self.step, {"model": self.model}, state)

    def resume(self, path: str | Path | None = None) -> bool:
        """Continue from a checkpoint (default: the latest of this workdir); False if none."""
        path = Path(path) if path else self.checkpoints.latest()
        if path is None:
            return False
        state = Checkpointer.load(path, {"model": self.model})
        if not same_run(state["train_config"], self.cfg):
            raise ValueError(f"checkpoint {path} was written with a different train config")
        pos = state["position"]
        self.phase, self.phase_step, self.step = pos["phase"], pos["phase_step"], pos["step"]
        for name, engine in self.engines.items():
            engine.load_state_dict(state["engines"][name])
        restore_rng(state["rng"], *self.rng_sources())
        self.load_extra_state(state["extra"])
        self.history = defaultdict(list, {k: [tuple(p) for p in v] for k, v in state["history"].items()})
        self.run_ids = state["run_ids"]
        self.best = state.get("best")
        log.info("resumed from %s at step %d (phase %d, step %d in phase)", path, self.step, self.phase,
                 self.phase_step)
        return True
