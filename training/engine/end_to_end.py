"""End-to-end training of the comparison models: ``joint``, ``flattened``, ``record_view``, ``table``.

One network, one engine, task loss only; ``rounds`` chunks of task steps, each followed by a
dev evaluation, then the final evaluation -- the same phases, checkpoints, resume and metric
names as the interleaved trainer (training.engine.phased), so runs compare side by side.

* ``joint``: TVM-KA trained end to end (seqenc.baselines.JointTVMKA; windows -> TVM -> KR with
  gradients -> KA), two BERT stacks without shared heads, as the paper's joint model.
* ``flattened``: a BERT over all objects of a sequence flattened into one input
  (seqenc.baselines.FlattenedEncoder; most recent whole objects within ``max_positions``),
  random init or a pre-trained BERT checkpoint.
* ``record_view``: Transformers4Rec-style object vectors and a BERT over the object sequence
  (seqenc.baselines.RecordViewEncoder).
* ``table``: a table task's text + flattened table through one encoder whose attention sees the
  table as the model config's ``table_attention`` says (seqenc.table_model: dense, MATE,
  TableFormer), or MAFiD's per-row encoding and fusion (seqenc.mafid).

Choices: the baselines get no masked-LM pre-training of their own (the paper fine-tunes them
on the task); by default they make as many updates as the interleaved run makes in all
(``TrainConfig.task_steps``), with their own learning rate ``lr_task``; class weights as in the
KA's task loss.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import polars as pl
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from seqenc.baselines import (
    FlattenedEncoder,
    JointTVMKA,
    ObjectSequences,
    RecordViewEncoder,
    plain_config,
)
from seqenc.config import TVMKAConfig
from seqenc.fixup import fixup_table_encoder
from seqenc.inference import to_model
from seqenc.pretrained import load_bert_encoder, load_bert_table_encoder
from seqenc.sequences import TokenizedSequences
from seqenc.table_checks import wide_batch
from seqenc.table_model import TableExamples, table_encoder
from seqenc.tokenizer import ValueTokenizer
from training.engine.collectives import all_gather_ragged
from training.engine.engines import make_engine, shard
from training.engine.modes import END_TO_END
from training.engine.phased import PhasedTrainer
from training.engine.table_pretrain import LookupCurriculum
from training.engine.trainer import TrainConfig, phase_plan
from training.tasks.data import class_weights


class EndToEndTrainer(PhasedTrainer):
    """``inputs(index) -> tuple`` gives ``model(*inputs)`` for the sequences ``index`` -> logits."""

    def __init__(self, model: torch.nn.Module, inputs, y: np.ndarray, splits: dict[str, np.ndarray],
                 cfg: TrainConfig, workdir, task: str, n_classes: int, **kwargs):
        if cfg.mode not in END_TO_END:
            raise ValueError(f"EndToEndTrainer runs {END_TO_END}, not {cfg.mode!r}")
        super().__init__(model, y, splits, cfg, workdir, task, phase_plan(cfg), **kwargs)
        self.inputs = inputs
        total = sum(n for kind, _, n in self.plan if kind in ("task", "table_pretrain"))
        # a table encoder's intermediate pre-training (training.engine.table_pretrain), on the train tables
        self.curriculum = None
        if any(kind == "table_pretrain" for kind, _, _ in self.plan):
            if not isinstance(inputs, TableInputs) or getattr(model, "lookup_head", None) is None:
                raise ValueError("table_pretrain_steps needs a table encoder with table_lookup_head (training mode "
                                 "table)")
            self.curriculum = LookupCurriculum(inputs.tables_of(splits["train"]), cfg.table_pretrain_rows,
                                               cfg.table_pretrain_steps, cfg.seed, cfg.table_pretrain_kinds)
        # a table encoder with DT-Fixup's new layers (seqenc.fixup) trains without warm-up
        self.fixup = hasattr(model, "fixup_mu")
        warmup = 0 if self.fixup else cfg.warmup_steps
        self.engines = {"model": make_engine(model, cfg.lr_task, cfg.weight_decay, warmup, total,
                                             cfg.grad_clip, cfg.deepspeed)}
        self.weights = class_weights(y[splits["train"]], n_classes, task)
        self.rng = np.random.default_rng(cfg.seed)
        self.ema: dict[str, torch.Tensor] | None = None  # ema_decay: the averaged weights, from the first task update

    def update_ema(self) -> None:
        """After a task update: average <- decay * average + (1 - decay) * weights (floating-point
        entries of the state dict; others, e.g. counters, follow the weights)."""
        if not self.cfg.ema_decay:
            return
        state = self.model.state_dict()
        if self.ema is None:
            self.ema = {k: v.detach().clone() for k, v in state.items()}
            return
        with torch.no_grad():
            for k, v in state.items():
                if v.is_floating_point():
                    self.ema[k].lerp_(v.detach(), 1.0 - self.cfg.ema_decay)
                else:
                    self.ema[k].copy_(v)

    @contextmanager
    def averaged(self):
        """The model holds the averaged weights inside (none yet: unchanged), its own after."""
        if self.ema is None:
            yield
            return
        own = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        self.model.load_state_dict(self.ema)
        try:
            yield
        finally:
            self.model.load_state_dict(own)

    def log_dev(self, round_no: int) -> dict:
        with self.averaged():  # keep_best then keeps the averaged weights
            return super().log_dev(round_no)

    def run_phase(self, kind: str, round_no: int, steps: int) -> dict | None:
        if kind == "table_pretrain":
            self.lookup_steps(steps)
        elif kind == "task":
            self.task_steps(steps, round_no)
        elif kind == "eval":
            return self.log_dev(round_no)
        elif kind == "final":
            if self.ema is not None and self.best is None:  # without keep_best the average is the final model
                self.model.load_state_dict(self.ema)
            return self.evaluate()
        return None

    def task_steps(self, steps: int, round_no: int) -> None:
        train_idx, engine = self.splits["train"], self.engines["model"]
        if self.fixup and float(self.model.fixup_mu) == 0:  # once, before the first step (not on resume)
            self.fixup_model()
        wide = getattr(self.model, "wide", None)
        if self.cfg.table_wide_fit_epochs and getattr(wide, "fitted", None) is not None and not int(wide.fitted):
            self.log_metrics({"model/wide_fit_loss": self.fit_wide()}, self.step)  # once, as DT-Fixup's scaling
        desc = f"round {round_no} {self.cfg.mode} task steps"
        for _ in tqdm(range(self.phase_step, steps), desc=desc, disable=not self.progress, leave=False):
            self.model.train()
            loss_sum = 0.0
            for _ in range(self.cfg.grad_accum):
                batch = self.rng.choice(train_idx, size=min(self.cfg.batch_size, len(train_idx)), replace=False)
                batch = shard(batch, self.rank, self.world)
                self.work["task_rows"] += len(batch)
                inputs = to_model(self.inputs(batch.tolist()), self.model)
                labels, weights = to_model((torch.as_tensor(self.y[batch]), self.weights), self.model)
                loss = F.cross_entropy(self.model(*inputs), labels, weight=weights)
                engine.backward(loss / self.cfg.grad_accum)
                loss_sum += loss.item() / self.cfg.grad_accum
            self.update(engine, {"train/task_loss": loss_sum},
                        after=lambda: (self.update_ema(), self.maybe_eval(steps, round_no)))

    def lookup_steps(self, steps: int) -> None:
        """Intermediate pre-training: the lookup head on statements from the train tables, stage
        by stage (training.engine.table_pretrain); the whole model trains, the task head is not read."""
        engine = self.engines["model"]
        if self.fixup and float(self.model.fixup_mu) == 0:
            self.fixup_model()
        for _ in tqdm(range(self.phase_step, steps), desc="table lookup pre-training", disable=not self.progress,
                      leave=False):
            self.model.train()
            examples, labels = shard(self.curriculum.batch(self.phase_step, self.cfg.batch_size), self.rank, self.world)
            inputs, labels = to_model((self.inputs.of(examples), torch.as_tensor(labels)), self.model)
            loss = F.cross_entropy(self.model.lookup_logits(*inputs), labels)
            engine.backward(loss)
            self.update(engine, {"train/lookup_loss": loss.item()})

    def extra_state(self) -> dict:
        state = {"lookup_rng": self.curriculum.rng.getstate()} if self.curriculum is not None else {}
        return state | ({"ema": self.ema} if self.ema is not None else {})

    def load_extra_state(self, state: dict) -> None:
        ema = state.get("ema")  # read back on the CPU: beside the weights it averages
        self.ema = {k: v.to(self.model.state_dict()[k].device) for k, v in ema.items()} if ema is not None else None
        if self.curriculum is not None and "lookup_rng" in state:
            version, internal, gauss = state["lookup_rng"]
            self.curriculum.rng.setstate((version, tuple(internal), gauss))

    def fixup_model(self) -> None:
        """DT-Fixup's scaling of the new layers, from their input norm over every train example."""
        train, size = self.splits["train"], max(1, self.cfg.batch_size * 2)
        batches = (to_model(self.inputs(train[i:i + size].tolist()), self.model) for i in range(0, len(train), size))
        self.log_metrics({"model/fixup_mu": fixup_table_encoder(self.model, batches)}, self.step)

    def fit_wide(self) -> float:
        """The wide head alone on the train examples' features (:func:`fit_wide_head`)."""
        train = self.splits["train"]
        examples = [self.inputs.examples.tables[int(i)] for i in train]
        features = wide_batch(self.model.config.table_wide_features, examples)
        features, labels, weights = to_model((features, torch.as_tensor(self.y[train]), self.weights), self.model)
        return fit_wide_head(self.model.wide, features, labels, weights, self.cfg.table_wide_fit_epochs, self.cfg.seed)

    @torch.no_grad()
    def probabilities(self, index: np.ndarray | None = None) -> np.ndarray:
        """[n_sequences, n_outputs]: the rows ``index`` (default all) from forward passes, others NaN.
        With several data-parallel ranks each computes the rows ``index[rank::world]`` and all
        gather (training.engine.sharding; ZeRO 3, whose forward passes are collective, is refused)."""
        self.model.eval()
        index = np.arange(len(self.y)) if index is None else np.asarray(index)
        index = index if len(index) else np.arange(min(1, len(self.y)))  # one row still gives the width
        mine = index[self.rank::self.world]
        self.work["eval_rows"] += len(mine)
        size = max(1, self.cfg.batch_size * 2)
        probs = [torch.softmax(self.model(*to_model(self.inputs(part.tolist()), self.model)), -1).float().cpu()
                 for part in (mine[i:i + size] for i in range(0, len(mine), size))]
        if not probs:  # a rank with no rows: one forward pass for the width
            probs = [torch.softmax(self.model(*to_model(self.inputs(index[:1].tolist()), self.model)), -1)
                     .float().cpu()[:0]]
        probs = torch.cat(probs)
        out = np.full((len(self.y), probs.shape[1]), np.nan, dtype=np.float32)
        for r, part in enumerate(all_gather_ragged(probs, self.world)):
            out[index[r::self.world]] = part.numpy()
        return out

    def split_probabilities(self, splits: tuple[str, ...]) -> np.ndarray:
        # a forward pass per example: only the rows the metrics read (a dev evaluation no
        # longer costs a pass over every training example)
        return self.probabilities(np.unique(np.concatenate([self.splits[s] for s in splits])))

    def rng_sources(self):
        return {}, {"batches": self.rng}


def fit_wide_head(wide: torch.nn.Module, features: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor | None,
                  epochs: int, seed: int, batch: int = 200, lr: float = 1e-3) -> float:
    """Fit a table encoder's wide head (seqenc.heads.WideHead, "mlp" form) alone, before the
    encoder's first task update: ``epochs`` passes over the train examples' features [N, F] in
    shuffled batches of ``batch``, Adam at ``lr`` (scikit-learn's MLP defaults), the task's class
    weights; then its ``fitted`` flag is set. Returns the last epoch's mean loss. Why: trained
    only with the encoder, the wide head gets the encoder's ~3 epochs at a decaying rate, and the
    same features reach more in a model of their own (docs/tables.md, "Checks for the wide head":
    ``checks_mlp``); fitted first, the encoder learns what the features leave. Off by default
    (``TrainConfig.table_wide_fit_epochs`` = 0): on TabFact's dev split it did not gain."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(wide.parameters(), lr=lr)
    wide.train()
    last = 0.0
    for _ in range(epochs):
        order, total = torch.randperm(len(labels), generator=generator).to(labels.device), 0.0
        for start in range(0, len(labels), batch):
            part = order[start:start + batch]
            loss = F.cross_entropy(wide(features[part]), labels[part], weight=weights)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item() * len(part)
        last = total / max(1, len(labels))
    wide.fitted.fill_(1)
    return last


class TableInputs:
    """``inputs(index)`` of a table encoder over a task's examples (its own ``batch_inputs``), and
    what lookup pre-training needs besides: the examples' tables and the inputs of new examples."""

    def __init__(self, model, examples: TableExamples, tok: ValueTokenizer):
        self.model, self.examples, self.tok = model, examples, tok

    def __call__(self, index) -> tuple:
        return self.model.batch_inputs(self.examples, index, self.tok)

    def of(self, examples: list[tuple[str, list[str], list[list[str]]]]) -> tuple:
        """The inputs of ``examples`` given as (text, header, rows)."""
        return self.model.batch_inputs(TableExamples([str(i) for i in range(len(examples))], examples),
                                       range(len(examples)), self.tok)

    def tables_of(self, index) -> list[tuple[list[str], list[list[str]]]]:
        """The distinct tables (header, rows) of the examples ``index``: a table that several
        texts share counts once."""
        seen, out = set(), []
        for i in index:
            _, header, rows = self.examples.tables[int(i)]
            key = (tuple(header), tuple(map(tuple, rows)))
            if key not in seen:
                seen.add(key)
                out.append((header, rows))
        return out


def joint_model(config: TVMKAConfig, data: TokenizedSequences, tok: ValueTokenizer, objects: pl.DataFrame,
                exclude_keys: tuple[str, ...] = (), pretrained: str | None = None):
    """``joint``: TVM-KA end to end; it reads the windows of ``data`` (``objects`` unused)."""
    model = JointTVMKA(plain_config(config))
    return model, lambda idx: model.batch_inputs(data, idx, tok)


def table_model(config: TVMKAConfig, data: TokenizedSequences, tok: ValueTokenizer, objects: pl.DataFrame,
                exclude_keys: tuple[str, ...] = (), pretrained: str | None = None):
    """``table``: a table task's examples, text + flattened table (seqenc.table_model, seqenc.mafid)."""
    model = table_encoder(plain_config(config))
    if pretrained:
        load_bert_table_encoder(model, pretrained)
    objects = _objects_of(objects, data).filter(~pl.col("key").is_in(list(exclude_keys)))
    return model, TableInputs(model, TableExamples.from_objects(objects, list(data.sequence_ids)), tok)


def flattened_model(config: TVMKAConfig, data: TokenizedSequences, tok: ValueTokenizer, objects: pl.DataFrame,
                    exclude_keys: tuple[str, ...] = (), pretrained: str | None = None):
    """``flattened``: one BERT over a sequence's objects, flattened (random or pre-trained init)."""
    model = FlattenedEncoder(plain_config(config))
    if pretrained:
        load_bert_encoder(model.embeddings, model.encoder, model.config, pretrained)
    seqs = _object_sequences(objects, data, tok, exclude_keys)
    return model, lambda idx: model.batch_inputs(seqs, idx, tok)


def record_view_model(config: TVMKAConfig, data: TokenizedSequences, tok: ValueTokenizer, objects: pl.DataFrame,
                      exclude_keys: tuple[str, ...] = (), pretrained: str | None = None):
    """``record_view``: Transformers4Rec-style object vectors and a BERT over them."""
    model = RecordViewEncoder(plain_config(config), "pool")
    seqs = _object_sequences(objects, data, tok, exclude_keys)
    return model, lambda idx: model.batch_inputs(seqs, idx, tok)


def _objects_of(objects: pl.DataFrame, data: TokenizedSequences) -> pl.DataFrame:
    return objects.join(pl.DataFrame({"sequence_id": data.sequence_ids}), on="sequence_id", how="semi")


def _object_sequences(objects: pl.DataFrame, data: TokenizedSequences, tok: ValueTokenizer,
                      exclude_keys: tuple[str, ...]) -> ObjectSequences:
    """The objects of ``data``'s sequences, in its order, as the object-level models read them."""
    by_id = ObjectSequences.from_objects(_objects_of(objects, data), tok, exclude_keys)
    position = {s: i for i, s in enumerate(by_id.sequence_ids)}
    return ObjectSequences(list(data.sequence_ids), [by_id.objects[position[s]] for s in data.sequence_ids])
