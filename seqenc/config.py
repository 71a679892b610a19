"""One configuration for the whole TVM-KA stack.

Every module in :mod:`seqenc.model` is built from a :class:`TVMKAConfig`. The config travels
with the weights (``config.json`` beside ``model.safetensors``), so a saved model can be
rebuilt without any other input.

Vocabulary used everywhere: ``d_model`` (width), ``n_layers``, ``n_heads`` (h),
``n_shared_heads`` (p, the heads whose Q/K/V weights the TVM and the KA share), ``d_ff``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

TASKS = ("binary", "multiclass", "next_item")  # the model's heads (seqenc.heads); task kinds map onto them
TVM_POSITIONS = ("sequence", "within_value")
TABLE_ATTENTIONS = ("dense", "mate_mask", "mate", "tableformer", "mafid")  # seqenc.table_model, seqenc.mafid
KA_INITS = ("default", "dt_fixup")  # seqenc.fixup
TABLE_WIDE_HEADS = ("linear", "mlp")  # the wide head's form: seqenc.heads.WideHead
TABLE_WIDE_FEATURES = ("overlap", "checks")  # what a wide table head reads: seqenc.table_checks.WIDE_FEATURES
TABLE_ROW_COUNTS = ("cells", "spans")  # what a row's match bucket counts: seqenc.table_inputs (row_match)
KA_MIXERS = ("attention", "ema")  # seqenc.model.KeyAggregator
LONG_SEQUENCES = ("window", "balanced", "truncate")  # an S(k) past the window: seqenc.sequences.value_sequence_windows
# the buckets of a classifier's hashed bag of values (TVMKAConfig.value_counts, seqenc.heads)
VALUE_COUNT_BUCKETS = 1 << 16
# TableConfig's fields whose class default changed after models were saved without them: such a
# saved config loads with the value it was trained with (TVMKAConfig.from_dict)
LEGACY_FIELDS = {"table_match": False, "table_numeric": False, "tableformer_bias_scale": 1.0,
                 "table_attention": "dense", "table_row_match": False, "table_row_count": "cells",
                 "table_header_match": False, "table_wide_features": "overlap",
                 "table_wide_head": "linear"}


@dataclass
class TVMKAConfig:
    # --- tokens -----------------------------------------------------------------------------
    vocab_size: int = 8192
    pad_token_id: int = 0
    max_positions: int = 512  # TVM window, in tokens, including [CLS] k [VAL_SEP]
    # What the TVM's position embeddings count (seqenc.model.Embeddings):
    # "sequence" (the paper): the token's index in S(k), so KR(k) depends on the order of values;
    # "within_value": the token's offset inside its value (the key and each value count from 1 after
    # [CLS] / their [VAL_SEP]), so S(k) reads as a bag of values -- KR(k) depends on which values
    # occur and how often, not on their order -- while a value's own tokens keep theirs. For logs
    # whose order is interleaving noise (concurrent writers). It needs val_sep_token_id. hdfs by
    # content, dev F1 of seeds 0-2: within_value 0.9993 against sequence 0.974; bgl 1.000 against
    # 0.974; value_anomaly (seed 0 only) 0.877 against 0.984 (docs/model.md): the paper's "sequence"
    # stays the default, within_value is chosen per task.
    tvm_positions: str = "sequence"
    val_sep_token_id: int | None = None  # the tokenizer's [VAL_SEP] id (set where a tokenizer is at hand)
    type_vocab_size: int = 2  # kept for checkpoint compatibility with BERT (always type 0)
    # quantile-bin tokens before numeric values (seqenc.numeric), this many bins per numeric key;
    # 0 = none (the default; on value_anomaly 16 bins moved test F1 by less than the spread
    # between seeds, seqenc/numeric.py).
    # A tokenisation setting: the edges live with the tokenizer (numeric_bins.json); the model
    # records how many it was trained with.
    numeric_bins: int = 0
    # with numeric_bins: at most this many extra cuts in each of a key's two outer quantile bins,
    # where its train values leave a gap of a decade or more (seqenc.numeric), so a cluster of
    # magnitudes far from the bulk gets a bin of its own; 0 = none. A tokenisation setting as
    # numeric_bins.
    numeric_gap_cuts: int = 0
    # a [LINKED] / [ALONE] marker before every value of S(k): whether the value also occurs under
    # another key of the same sequence (seqenc.links). A tokenisation setting as numeric_bins: the
    # markers live in tokenizer.json. Off by default (it changes what S(k) is; measured in the
    # docstring of seqenc.links).
    value_links: bool = False
    # a [SEEN] / [NEW] marker before every value of S(k): whether an earlier value of S(k) has the
    # same text (seqenc.links). A tokenisation setting as value_links; off by default.
    value_repeats: bool = False
    # a last value [END] closing every S(k) (seqenc.sequences): where a key's values stop becomes
    # something the masked LM predicts. A tokenisation setting as value_links; off in the class
    # (the paper's S(k)), on for anomaly tasks without labels (training.tasks.kinds, model_defaults: hdfs dev F1
    # 0.999 against 0.826, docs/training.md).
    value_end: bool = False

    # --- encoder (shared by TVM and KA: "the same architecture") ----------------------------
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 8
    n_shared_heads: int = 4  # p in the paper; 0 disables sharing
    d_ff: int = 1024
    hidden_act: str = "gelu"  # "gelu" (exact, as BERT), "gelu_tanh" (BERT's "gelu_new") or "relu"
    dropout: float = 0.1
    attn_dropout: float = 0.1
    layer_norm_eps: float = 1e-12
    attn_backend: str = "sdpa"  # a key of seqenc.attention.ATTENTION_BACKENDS
    # std of the normal init of weights; None = d_model ** -0.5. BERT's fixed 0.02 suits 768-wide
    # models; at the small widths a CPU affords it leaves the attention path at ~1% of the
    # residual stream, so the [CLS] output (KR) barely depends on the values.
    initializer_range: float | None = None

    # --- the KA's depth and initialisation (seqenc.fixup) ------------------------------------
    # ka_layers: the KA's own depth (None: n_layers); KA layer i < n_layers shares the TVM layer
    # i's heads, deeper KA layers have private heads only. ka_init "dt_fixup" (Xu et al., 2021):
    # the KA's layers without LayerNorm, Xavier-initialised and scaled by N^-1/2 / (2 mu) once the
    # KA's input norm mu is measured on the training data; no KA warm-up.
    ka_layers: int | None = None
    ka_init: str = "default"
    # how the KA's keys interact: "attention" (the paper), or "ema" for long key sets -- MAFiD's
    # low-dimensional damped EMA (seqenc.ema, reduction mafid_reduction) in place of self-attention,
    # linear in the number of keys; the keys are then read in their order (first seen)
    ka_mixer: str = "attention"

    # --- DropHead on the shared heads, TVM only, training only (paper: 0.2) ----------------
    drophead: float = 0.2

    # --- replaced-value detection (RVD): an optional second TVM objective --------------------
    # The paper trains the TVM with MLM alone, which never trains position 0, so KR(k) only
    # summarises S(k) by chance. With RVD on, a linear head on the [CLS] output learns, in the
    # TVM steps, whether one value of S(k) was swapped for a value of the same key from another
    # sequence (training.tasks.data.MLMBatches), so KR(k) carries "these values disagree". Off by
    # default (the paper); ``seqenc bench accuracy --modes interleaved+rvd`` measures it.
    replaced_value_detection: bool = False

    # --- reconstruction surprise (seqenc.surprise), binary tasks ------------------------------
    # With it on, the final anomaly score is the larger of the KA's logit and the masked-LM
    # surprise of a key's values, each scored by its tail on the normal dev sequences. Train
    # with TrainConfig.mlm_sequences="normal" so that the TVM learns normal values only.
    # Off in the class (the paper scores with the KA alone); a binary task of the catalogue turns it
    # on, kept only where its dev F1 beats the KA's alone (training.tasks.kinds, task_defaults).
    surprise_scoring: bool = False

    # --- value sequences longer than the window ---------------------------------------------
    # "window": split S(k) into windows that each start with [CLS] k [VAL_SEP] and mean-pool
    # the windows' [CLS] vectors into KR(k), packed greedily; "balanced": as many windows, the
    # values spread evenly (no short remainder window, seqenc.sequences; chosen 2026-12-06,
    # docs/model.md "Long S(k)"); "truncate": keep only the most recent values.
    long_sequences: str = "balanced"  # LONG_SEQUENCES; "window" before 2026-12-06 (saved configs keep theirs)
    max_windows: int = 64  # safety bound per key; windows past it are counted and logged

    # --- task head on the KA ----------------------------------------------------------------
    # "binary" / "multiclass": a classifier over n_classes (class_names for reports);
    # "next_item": retrieval over a catalogue of n_items learned item embeddings (top-k).
    task: str = "binary"
    n_classes: int = 2
    class_names: list[str] = field(default_factory=list)
    n_items: int = 0
    # next_item: the head also reads the sequence's own item history -- per catalogue item, how
    # often and how recently it occurs among the values of the task's item key -- through two
    # learned weights added to every item's score (seqenc.heads.NextItemHead). Off in the class
    # (the paper's head; bundles saved before it load unchanged); on for next_item tasks by
    # the task kind's model_defaults (training.tasks.kinds), the measured best.
    item_history: bool = False
    # binary / multiclass: the classifier also reads the sequence's bag of values -- log(1 + count)
    # of every (key, value) pair of its S(k), hashed into this many buckets -- through a linear layer
    # whose logits add to the KA's (wide and deep; seqenc.heads.ClassificationHead). 0: off (the
    # paper's head reads the KA's embedding only). Needs val_sep_token_id.
    value_counts: int = 0

    # the EMA's reduction K (d_model / K channels): ka_mixer "ema" and MAFiD's EMA across rows
    # (TableConfig) both read it
    mafid_reduction: int = 4

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if not 0 <= self.n_shared_heads <= self.n_heads:
            raise ValueError(f"n_shared_heads={self.n_shared_heads} must lie in [0, {self.n_heads}]")
        if not 0.0 <= self.drophead < 1.0:
            raise ValueError(f"drophead={self.drophead} must lie in [0, 1)")
        if self.task not in TASKS:
            raise ValueError(f"task={self.task!r} is not one of {TASKS}")
        if self.task == "next_item" and self.n_items < 1:
            raise ValueError("task='next_item' needs n_items >= 1 (the catalogue size)")
        if self.item_history and self.task != "next_item":
            raise ValueError("item_history is for task='next_item'")
        if self.value_counts < 0:
            raise ValueError(f"value_counts={self.value_counts} must be >= 0 (0: the head reads no bag of values)")
        if self.value_counts and self.task not in ("binary", "multiclass"):
            raise ValueError(f"value_counts is for the classification tasks (binary, multiclass), not {self.task!r}")
        if self.value_counts and self.val_sep_token_id is None:
            raise ValueError("value_counts needs val_sep_token_id (the tokenizer's [VAL_SEP] id) to find the values")
        if self.numeric_bins < 0:
            raise ValueError(f"numeric_bins={self.numeric_bins} must be >= 0 (0: no bin tokens)")
        if self.numeric_gap_cuts < 0:
            raise ValueError(f"numeric_gap_cuts={self.numeric_gap_cuts} must be >= 0 (0: no cuts at magnitude gaps)")
        if self.surprise_scoring and self.task != "binary":
            raise ValueError(f"surprise_scoring combines anomaly scores: it needs task='binary', not {self.task!r}")
        if self.tvm_positions not in TVM_POSITIONS:
            raise ValueError(f"tvm_positions={self.tvm_positions!r} is not one of {TVM_POSITIONS}")
        if self.tvm_positions == "within_value" and self.val_sep_token_id is None:
            raise ValueError("tvm_positions='within_value' needs val_sep_token_id (the tokenizer's [VAL_SEP] id)")
        if self.long_sequences not in LONG_SEQUENCES:
            raise ValueError(f"long_sequences={self.long_sequences!r} is not one of {LONG_SEQUENCES}")
        if self.ka_layers is not None and self.ka_layers < 1:
            raise ValueError(f"ka_layers={self.ka_layers} must be >= 1 (or None: n_layers)")
        if self.ka_mixer not in KA_MIXERS:
            raise ValueError(f"ka_mixer={self.ka_mixer!r} is not one of {KA_MIXERS}")
        if self.ka_mixer == "ema" and self.ka_init == "dt_fixup":
            raise ValueError("ka_init='dt_fixup' scales attention layers; ka_mixer='ema' has none")
        if self.ka_init not in KA_INITS:
            raise ValueError(f"ka_init={self.ka_init!r} is not one of {KA_INITS}")

    @property
    def init_std(self) -> float:
        return self.initializer_range if self.initializer_range is not None else self.d_model ** -0.5

    @property
    def ka_depth(self) -> int:
        return self.ka_layers if self.ka_layers is not None else self.n_layers

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @property
    def n_outputs(self) -> int:
        """Width of the KA's output: classes, or catalogue items for next-item retrieval."""
        return self.n_items if self.task == "next_item" else self.n_classes

    # --- persistence ------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> TVMKAConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        if cls is TVMKAConfig:  # saved before TableConfig: every config carried the (unused) table fields
            data = {k: v for k, v in data.items() if k not in TABLE_FIELDS}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown config fields: {unknown}")
        return cls(**{**cls.legacy_fields(), **data})

    @classmethod
    def legacy_fields(cls) -> dict:
        """Fields whose default changed after models were saved without them (:data:`LEGACY_FIELDS`)."""
        return {}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True))

    @classmethod
    def load(cls, path: str | Path) -> TVMKAConfig:
        return cls.from_dict(json.loads(Path(path).read_text()))


@dataclass
class TableConfig(TVMKAConfig):
    """The table-text encoders' config (seqenc.table_model, seqenc.mafid; training mode ``table``),
    as each model family has its own config class in transformers: the encoder fields it shares
    with TVMKAConfig (width, depth, heads, vocabulary, head) plus the table's own below. Saved as
    one flat ``config.json``; a table model's bundle loads it back into this class
    (``config_class`` of the model, seqenc.model.SaveLoadMixin)."""

    # how attention sees a table (seqenc.structure): "dense" (all pairs; row and column
    # embeddings, TAPAS-style), "mate_mask" / "mate" (MATE's row and column heads: the reference
    # mask / the efficient bucketed attention), "tableformer" (13 relation biases per head, no
    # row or column embeddings: invariant to row and column order). Default mate (2026-12-07,
    # docs/tables.md "One recipe"): under the size's table_train, 4-row lookups' dev splits of
    # seeds 0 and 1 tie (mean dev 0.968 mate, 0.969 tableformer; the rule written before the runs: a
    # tie within 0.005 goes to mate), MATE is the encoder whose recipe was chosen on TabFact's dev
    # splits, and a TableFormer update costs ~3.4 MATE updates on TabFact's tables. tableformer was
    # the default from 2026-11-28 (the best of four on lookup4 before the row-match ids). A config
    # saved without the field loads as "dense", the default before that (LEGACY_FIELDS)
    table_attention: str = "mate"
    max_rows: int = 256  # data rows kept (and row embeddings); seqenc.table_inputs
    max_columns: int = 64
    max_cell_tokens: int = 16
    max_text_tokens: int = 64
    mate_row_heads: int | None = None  # MATE's row heads (the first ones); None: half the heads
    mate_global: int = 66  # the efficient MATE's global section G: [CLS] + 64 text tokens + [SEP]
    mate_radius: int = 64  # its bucket size R: exact while a row / column has at most R tokens
    max_table_tokens: int = 512  # the whole text + table sequence (positions are per cell: max_positions)
    # TableFormer past this many tokens: attention a block of this many queries at a time, the
    # relation bias built per block and recomputed in the backward pass (no [h, L, L] tensor); 0: never
    tableformer_block: int = 1024
    # TableFormer's relation scalars are this times their parameter (seqenc.structure.TableFormerBias:
    # Adam's pace per update is the learning rate, so a bias of 1 took ~1,000 updates at scale 1);
    # a config saved before the field loads with 1 (LEGACY_FIELDS)
    tableformer_bias_scale: float = 30.0
    # table_attention "mafid" (seqenc.mafid): the EMA across rows ("lowdim", "full" or "none"), its
    # reduction K (d_model / K channels) and the tanh gates (False: the ablation without gates)
    mafid_ema: str = "lowdim"
    mafid_gate: bool = True
    # new layers on top of a table encoder's n_layers (a pre-trained one: --pretrained), with the
    # same table attention; table_init "dt_fixup" (seqenc.fixup, as ka_init): those layers without
    # LayerNorm, Xavier-initialised, scaled once their input norm mu is measured; no warm-up
    table_new_layers: int = 0
    table_init: str = "default"
    # exact-match features (seqenc.table_inputs: a token's word found on the other side, or its
    # whole cell named by the text) as one more embedding of the table encoders' inputs. On: the
    # default (docs/tables.md); a config saved before the field existed loads with it off
    # (LEGACY_FIELDS), so its weights still fit
    table_match: bool = True
    # with table_match: a cell's match id also says how many cells of its row the text names whole
    # (seqenc.table_inputs, row_match). On: chosen on dev (docs/tables.md: the tiny lookup learned
    # on 6 of 6 seeds by dense, against 3 of 6; lookup4 left the chance plateau at the bench's
    # budget); off for a config saved before the field (LEGACY_FIELDS)
    table_row_match: bool = True
    # what a row's match bucket counts (TABLE_ROW_COUNTS; seqenc.table_inputs): "cells" named whole, or
    # "spans", the disjoint stretches of the text they name (a value a row holds twice, or "4" inside
    # "4.5", counts once). "spans": chosen on dev (docs/tables.md, 2026-11-29: lookup4 dense dev 0.947
    # against 0.928; TabFact mate dev 0.587 against 0.592, within a seed's spread); "cells" for a
    # config saved before the field (LEGACY_FIELDS)
    table_row_count: str = "spans"
    # with table_match: a cell's match id also says whether the text names its column's header whole
    # (seqenc.table_inputs, header_match); off for a config saved before the field (LEGACY_FIELDS)
    table_header_match: bool = True
    # numeric features (seqenc.table_numbers, TAPAS's): a cell's rank and inverse rank in its column
    # and its number's relation to the text's numbers, three more embeddings; on by default, off
    # for a config saved before the field (LEGACY_FIELDS)
    table_numeric: bool = True
    # a second head on a table encoder's pooled output, two logits for the lookup statements of
    # intermediate pre-training (training.engine.table_pretrain); the pipeline sets it when that runs
    table_lookup_head: bool = False
    # wide and deep for table encoders (as value_counts for sequences): the classifier's logits
    # also read seqenc.table_inputs.overlap_features (word overlap of the text with the best rows,
    # the table and the header) through a linear layer, zero at init. Off: the pure encoder
    table_wide: bool = False
    # what the wide head reads (TABLE_WIDE_FEATURES; seqenc.table_checks): "overlap", the five
    # word-overlap shares; "checks", those, the row-match counts and the checks of one-step
    # programs (superlatives, counts, comparisons, aggregates, numbers against the named row).
    # "checks": chosen on TabFact's dev split (docs/tables.md, "Checks for the wide head": mate_wide,
    # seed 0, best evaluation 0.627 against 0.618 with "overlap"); "overlap" for a config saved
    # before the field (LEGACY_FIELDS), so its weights still fit
    table_wide_features: str = "checks"
    # the wide head's form (TABLE_WIDE_HEADS; seqenc.heads.WideHead): "linear" on the features as
    # they are, or "mlp": standardised, linear plus one hidden layer. "mlp": chosen on dev (WideHead);
    # "linear" for a config saved before the field (LEGACY_FIELDS)
    table_wide_head: str = "mlp"


    def __post_init__(self) -> None:
        super().__post_init__()
        if self.table_attention not in TABLE_ATTENTIONS:
            raise ValueError(f"table_attention={self.table_attention!r} is not one of {TABLE_ATTENTIONS}")
        if self.table_row_count not in TABLE_ROW_COUNTS:
            raise ValueError(f"table_row_count={self.table_row_count!r} is not one of {TABLE_ROW_COUNTS}")
        if self.table_wide_features not in TABLE_WIDE_FEATURES:
            raise ValueError(f"table_wide_features={self.table_wide_features!r} is not one of {TABLE_WIDE_FEATURES}")
        if self.table_wide_head not in TABLE_WIDE_HEADS:
            raise ValueError(f"table_wide_head={self.table_wide_head!r} is not one of {TABLE_WIDE_HEADS}")
        if self.table_init not in KA_INITS:
            raise ValueError(f"table_init={self.table_init!r} is not one of {KA_INITS}")
        if self.table_new_layers < 0:
            raise ValueError(f"table_new_layers={self.table_new_layers} must be >= 0")
        if self.table_new_layers and self.table_attention == "mafid":
            raise ValueError("table_new_layers is for the dense, mate and tableformer encoders; MAFiD adds its own "
                             "layers (their gates start closed)")
        if self.table_init == "dt_fixup" and self.table_new_layers == 0:
            raise ValueError("table_init='dt_fixup' scales the table_new_layers: set table_new_layers >= 1")
        if self.mate_row_heads is not None and not 0 <= self.mate_row_heads <= self.n_heads:
            raise ValueError(f"mate_row_heads={self.mate_row_heads} must lie in [0, {self.n_heads}]")

    @classmethod
    def legacy_fields(cls) -> dict:
        return dict(LEGACY_FIELDS)


# the fields only a table encoder reads
TABLE_FIELDS = frozenset(f.name for f in dataclasses.fields(TableConfig)) - \
    frozenset(f.name for f in dataclasses.fields(TVMKAConfig))


def plain_config(config: TVMKAConfig) -> TVMKAConfig:
    """The same architecture with every head private and no DropHead (one network alone: the
    end-to-end baselines, seqenc.baselines, and the table encoders, seqenc.table_model)."""
    return dataclasses.replace(config, n_shared_heads=0, drophead=0.0)
