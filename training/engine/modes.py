"""The training modes: one registry, name -> how a model of that mode is built, trained and served.

Every list of modes derives from :data:`MODES` -- the CLI's ``--mode`` choices and help, the
catalogue's check of a task's ``mode``, the bench's modes, the check that a bundle holds the
model class its mode trains, and docs/training.md's table. A new mode is one entry here (plus
its model in seqenc/ and its test).

As transformers' auto classes map names to classes, an entry names its trainer, input builder and
model classes as ``"module:attribute"`` strings and imports them only when a job needs them: the
registry itself imports nothing, so the CLI, the catalogue and DAG parsing read it for free, and
the trainers may validate their config against it without an import circle.

* ``interleaved``: Algorithm 1 of the TVM-KA paper (training.engine.trainer.InterleavedTrainer):
  TVM masked-LM steps, KR refreshes and KA task steps, interleaved;
* ``no_interleave``: its ablation, every TVM step first, one refresh, then the KA;
* ``joint``, ``flattened``, ``record_view``, ``table``: one network trained end to end on the
  task (training.engine.end_to_end.EndToEndTrainer); ``build`` makes the model and its
  ``inputs(index)`` from the task's windows and objects;
* ``unlabelled``: the TVM's masked LM alone, scored by masked-value surprise
  (training.engine.unlabelled). Not a user's choice: an ``anomaly`` task trains it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


def _load(ref: str):
    """``"package.module:attribute"`` -> the attribute (imported now)."""
    module, _, attribute = ref.partition(":")
    return getattr(importlib.import_module(module), attribute)


@dataclass(frozen=True)
class Mode:
    name: str
    summary: str  # one line: the CLI's help, docs
    trainer: str  # "module:Class" of the trainer
    architectures: tuple[str, ...]  # class names of the models a bundle of this mode holds (serving checks)
    # end-to-end modes: "module:function", (config, data, tok, objects, exclude_keys, pretrained) ->
    # (model, inputs(index)); None: the mode reads S(k) windows (training.engine.trainer)
    build: str | None = None
    pretrained_init: bool = True  # may start from a BERT checkpoint (--pretrained)
    selectable: bool = True  # a --mode / catalogue choice (unlabelled: an anomaly task's own)
    scorable: bool = True  # its bundles score (seqenc score, batch scoring, the MLflow pyfunc)
    in_bench: bool = False  # among `seqenc bench accuracy`'s default modes
    config: str = "seqenc.config:TVMKAConfig"  # the model family's config class

    @property
    def end_to_end(self) -> bool:
        """Trained end to end with the task loss only (no KR cache; keep_best applies)."""
        return self.build is not None

    def trainer_class(self) -> type:
        return _load(self.trainer)

    def config_class(self) -> type:
        return _load(self.config)

    def build_model(self, config, data, tok, objects, exclude_keys=(), pretrained=None):
        """The end-to-end model of this mode and its ``inputs(index)`` over ``data``'s sequences."""
        if self.build is None:
            raise ValueError(f"mode {self.name!r} reads S(k) windows: it has no end-to-end model")
        return _load(self.build)(config, data, tok, objects, tuple(exclude_keys), pretrained)


_E2E = "training.engine.end_to_end"
_TABLE_MODELS = ("TableTextEncoder", "MafidTableEncoder")  # seqenc.table_model.TABLE_MODELS
MODES: dict[str, Mode] = {m.name: m for m in (
    Mode("interleaved", "Algorithm 1: TVM masked-LM steps, KR refreshes and KA task steps, interleaved (default)",
         "training.engine.trainer:InterleavedTrainer", ("TVMKA",), in_bench=True),
    Mode("no_interleave", "ablation: every TVM step first, one KR refresh, then the KA",
         "training.engine.trainer:InterleavedTrainer", ("TVMKA",), in_bench=True),
    Mode("joint", "TVM-KA end to end, gradients through the KRs (two stacks, no shared heads)",
         f"{_E2E}:EndToEndTrainer", ("JointTVMKA",), build=f"{_E2E}:joint_model", pretrained_init=False),
    Mode("flattened", "one BERT over the sequence's objects, flattened", f"{_E2E}:EndToEndTrainer",
         ("FlattenedEncoder",), build=f"{_E2E}:flattened_model", in_bench=True),
    Mode("record_view", "Transformers4Rec-style object vectors and a BERT over them", f"{_E2E}:EndToEndTrainer",
         ("RecordViewEncoder",), build=f"{_E2E}:record_view_model", pretrained_init=False, in_bench=True),
    Mode("table", "a text and its table through a table encoder (dense, MATE, TableFormer, MAFiD)",
         f"{_E2E}:EndToEndTrainer", _TABLE_MODELS, build=f"{_E2E}:table_model", config="seqenc.config:TableConfig"),
    Mode("unlabelled", "the TVM's masked LM alone, scored by masked-value surprise (anomaly tasks)",
         "training.engine.unlabelled:UnlabelledTrainer", ("TVMKA",), selectable=False),
)}
SELECTABLE = tuple(name for name, mode in MODES.items() if mode.selectable)
END_TO_END = tuple(name for name, mode in MODES.items() if mode.end_to_end)
BENCH_MODES = tuple(name for name, mode in MODES.items() if mode.in_bench)


def get_mode(name: str) -> Mode:
    """The registered, selectable mode ``name``; a ValueError naming the choices otherwise."""
    if name not in MODES or not MODES[name].selectable:
        raise ValueError(f"unknown training mode {name!r}; one of {', '.join(SELECTABLE)}")
    return MODES[name]


def mode_help() -> str:
    """The modes as ``name: summary`` (the CLI's --mode help)."""
    return "; ".join(f"{name}: {MODES[name].summary}" for name in SELECTABLE)
