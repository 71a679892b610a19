"""One encoder for a text and a table, with the table's structure chosen by ``table_attention``.

Input: seqenc.table_inputs (``[CLS] text [SEP]`` + the flattened table, per-token structure ids).
The layers are seqenc.model's post-LN BERT layers with every head private; the attention core is
seqenc.attention's, and the table structure enters as seqenc.structure makes it:

* ``dense``: every token attends to every token; row and column embeddings are added to the
  token embeddings (TAPAS, Herzig et al. 2020) -- the flattened baseline;
* ``mate_mask``: MATE's row and column heads as an attention bias (the reference);
* ``mate``: the same heads, computed bucket by bucket (MATE's Figure 2; linear in the length),
  equal to ``mate_mask`` while the text fits ``mate_global`` and a row / column ``mate_radius``;
* ``tableformer``: no row or column embeddings; per layer and head one learnable scalar per
  TableFormer relation, added to the scaled scores. With per-cell positions the output does not
  depend on the order of rows or columns (tests/test_table_model.py shuffles them).

The [CLS] output feeds the task head (seqenc.heads), as every model of the package. The model is
a training mode of its own ("table", training.engine.end_to_end) over a task whose examples join a text
to its table (training.tasks.task_data); :meth:`TableTextEncoder.batch_inputs` builds its batches.
"""

from __future__ import annotations

from functools import partial

import polars as pl
import torch
from torch import nn

from seqenc.attention import additive_mask
from seqenc.config import TableConfig, plain_config
from seqenc.fixup import xavier_init
from seqenc.heads import WideHead, make_head
from seqenc.mafid import MafidTableEncoder
from seqenc.model import Layer, SaveLoadMixin, init_weights
from seqenc.structure import (
    TableFormerBias,
    compact_relations,
    mate_attention,
    mate_layout,
    mate_mask,
    table_relations,
    tableformer_attention,
)
from seqenc.table_checks import WIDE_FEATURES, wide_batch
from seqenc.table_inputs import (
    collate,
    encode_table_text,
    match_vocabulary,
    table_of_objects,
)
from seqenc.table_numbers import NumericEmbeddings
from seqenc.tokenizer import ValueTokenizer

INPUTS = ("input_ids", "token_type_ids", "segment", "row_ids", "col_ids", "position_ids", "match_ids",
          "numeric_ids", "attention_mask")  # then, with table_wide, the wide features [B, F] (seqenc.table_checks)


class TableEmbeddings(nn.Module):
    """Token + per-cell position + token type (+ row + column, unless ``tableformer``) (+ exact
    match, with ``table_match``) (+ numeric, with ``table_numeric``; seqenc.table_inputs), then
    LayerNorm and dropout."""

    def __init__(self, config: TableConfig):
        super().__init__()
        self.word = nn.Embedding(config.vocab_size, config.d_model, padding_idx=config.pad_token_id)
        self.position = nn.Embedding(config.max_positions, config.d_model)
        self.token_type = nn.Embedding(config.type_vocab_size, config.d_model)
        structured = config.table_attention != "tableformer"
        self.row = nn.Embedding(config.max_rows + 1, config.d_model) if structured else None
        self.column = nn.Embedding(config.max_columns + 1, config.d_model) if structured else None
        self.match = nn.Embedding(match_vocabulary(config.table_row_match, config.table_header_match), config.d_model) \
            if config.table_match else None
        self.numeric = NumericEmbeddings(config.d_model) if config.table_numeric else None
        self.norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, input_ids, token_type_ids, position_ids, row_ids, col_ids, match_ids,
                numeric_ids) -> torch.Tensor:
        # [B, L] each (numeric_ids [B, L, 3]) -> [B, L, d_model]
        x = self.word(input_ids) + self.position(position_ids) + self.token_type(token_type_ids)
        if self.row is not None:
            x = x + self.row(row_ids) + self.column(col_ids)
        if self.match is not None:
            x = x + self.match(match_ids)
        if self.numeric is not None:
            x = x + self.numeric(numeric_ids)
        return self.dropout(self.norm(x))


class TableExamples:
    """Examples of a table task: ``sequence_ids`` and per example (text, header, rows)."""

    def __init__(self, sequence_ids: list[str], tables: list[tuple[str, list[str], list[list[str]]]]):
        self.sequence_ids, self.tables = sequence_ids, tables

    @classmethod
    def from_objects(cls, objects: pl.DataFrame, sequence_ids: list[str] | None = None) -> TableExamples:
        """One example per sequence of long-form objects (seqenc.table_inputs.table_of_objects),
        in the order of ``sequence_ids`` (default: first seen)."""
        groups = {key[0]: frame for key, frame in objects.group_by("sequence_id", maintain_order=True)}
        ids = sequence_ids if sequence_ids is not None else list(groups)
        missing = [s for s in ids if s not in groups]
        if missing:
            raise ValueError(f"{len(missing)} examples have no objects, e.g. {missing[:3]}")
        return cls(list(ids), [table_of_objects(groups[s]) for s in ids])

    def __len__(self) -> int:
        return len(self.sequence_ids)


class TableTextEncoder(SaveLoadMixin, nn.Module):
    """Text + table -> [CLS] -> task head; the table's structure as ``config.table_attention`` says."""

    config_class = TableConfig

    def __init__(self, config: TableConfig):
        super().__init__()
        check_table_config(config)
        self.config = config = plain_config(config)
        if config.table_attention == "mafid":
            raise ValueError("table_attention='mafid' is seqenc.mafid.MafidTableEncoder: build it with table_encoder()")
        if config.max_positions < max(config.max_text_tokens + 2, config.max_cell_tokens):
            raise ValueError(f"max_positions={config.max_positions} must cover a cell ({config.max_cell_tokens} "
                             f"tokens) and the text ([CLS] + {config.max_text_tokens} + [SEP]): positions are per cell; "
                             f"give {{\"model\": {{\"max_positions\": "
                             f"{max(config.max_text_tokens + 2, config.max_cell_tokens)}}}}} (or a smaller "
                             f"max_text_tokens) in --config")
        self.n_row_heads = config.mate_row_heads if config.mate_row_heads is not None else config.n_heads // 2
        self.embeddings = TableEmbeddings(config)
        self.layers = nn.ModuleList(Layer(config, None, 0.0) for _ in range(config.n_layers))
        # layers on top of a (pre-trained) encoder; DT-Fixup's are LayerNorm-free (seqenc.fixup)
        fixup = config.table_init == "dt_fixup"
        self.new_layers = nn.ModuleList(Layer(config, None, 0.0, norm=not fixup)
                                        for _ in range(config.table_new_layers))
        self.head = make_head(config)
        # intermediate pre-training's head (training.engine.table_pretrain): true / false lookup statements
        self.lookup_head = nn.Linear(config.d_model, 2) if config.table_lookup_head else None
        self.wide = WideHead(WIDE_FEATURES[config.table_wide_features][1], config.n_outputs,
                             config.table_wide_head) \
            if config.table_wide else None  # wide and deep
        init_weights(self, config.init_std)
        if self.embeddings.numeric is not None:
            self.embeddings.numeric.reset_parameters()  # zero at init (seqenc.table_numbers)
        if self.wide is not None:
            self.wide.reset_parameters()
        # TableFormer's scalars, one set per layer, zero at init (the paper)
        depth = config.n_layers + config.table_new_layers
        self.relation_bias = nn.ModuleList(TableFormerBias(config.n_heads, config.tableformer_bias_scale)
                                           for _ in range(depth)) \
            if config.table_attention == "tableformer" else None
        if fixup:  # Xavier now; the scaling waits for mu, measured on the training data (fixup_table_encoder)
            xavier_init(self.new_layers)
            self.register_buffer("fixup_mu", torch.zeros(()))

    def encode(self, input_ids, token_type_ids, segment, row_ids, col_ids, position_ids, match_ids, numeric_ids,
               attention_mask):
        # [B, L] each (numeric_ids [B, L, 3]) -> [B, d_model], the [CLS] output
        return self.hidden(input_ids, token_type_ids, segment, row_ids, col_ids, position_ids, match_ids,
                           numeric_ids, attention_mask)[:, 0]

    def hidden(self, input_ids, token_type_ids, segment, row_ids, col_ids, position_ids, match_ids, numeric_ids,
               attention_mask, new_layers: bool = True) -> torch.Tensor:
        # [B, L] each -> [B, L, d_model] after every layer (new_layers=False: before the new ones)
        x = self.embeddings(input_ids, token_type_ids, position_ids, row_ids, col_ids, match_ids, numeric_ids)
        kind, cfg = self.config.table_attention, self.config
        bias, attend, relations = None, None, None
        if kind == "dense":
            bias = additive_mask(attention_mask, x.dtype)  # padding only
        elif kind == "mate_mask":
            bias = mate_mask(row_ids, col_ids, segment, attention_mask, cfg.n_heads, self.n_row_heads, x.dtype)
        elif kind == "mate":  # laid out once, used by every layer
            layout = mate_layout(row_ids, col_ids, segment, attention_mask, self.n_row_heads, cfg.n_heads,
                                 cfg.mate_global, cfg.mate_radius, x.dtype)
            attend = partial(_mate_core, layout=layout, n_row_heads=self.n_row_heads)
        elif cfg.tableformer_block and x.size(1) > cfg.tableformer_block:  # long: block by block, no L x L
            relations = compact_relations(row_ids, col_ids, segment, cfg.tableformer_block)
            attend = partial(_tableformer_core, relations=relations, attention_mask=attention_mask,
                             block=cfg.tableformer_block)
        else:  # tableformer, short enough for the whole [h, L, L] bias
            relations = table_relations(row_ids, col_ids, segment)
        stack = [*self.layers, *self.new_layers] if new_layers else list(self.layers)
        for i, layer in enumerate(stack):
            if relations is not None and attend is None:
                bias = self.relation_bias[i](relations, attention_mask)
            layer_attend = partial(attend, scalars=self.relation_bias[i].weight) \
                if kind == "tableformer" and attend is not None else attend
            x = layer(x, bias, layer_attend)
        return x

    MASK_INPUT = INPUTS.index("attention_mask")  # where the mask sits in forward's inputs (seqenc.fixup)

    def forward(self, *inputs) -> torch.Tensor:
        # INPUTS [B, L] each (+ wide features [B, F] with table_wide) -> [B, n_outputs]
        logits = self.head(self.encode(*inputs[:len(INPUTS)]))
        return logits + self.wide(inputs[len(INPUTS)]) if self.wide is not None else logits

    def lookup_logits(self, *inputs) -> torch.Tensor:
        """``forward``'s inputs -> [B, 2]: the lookup head (``table_lookup_head``) on the [CLS] output."""
        return self.lookup_head(self.encode(*inputs[:len(INPUTS)]))

    def batch_inputs(self, data: TableExamples, index, tok: ValueTokenizer) -> tuple[torch.Tensor, ...]:
        """``forward``'s inputs for the examples ``index`` of ``data``, cut to ``max_table_tokens``."""
        c = self.config
        encoded = [encode_table_text(tok, *data.tables[int(i)], max_len=c.max_table_tokens,
                                     max_text_tokens=c.max_text_tokens, max_cell_tokens=c.max_cell_tokens,
                                     max_rows=c.max_rows, max_columns=c.max_columns, row_match=c.table_row_match,
                                     row_count=c.table_row_count,
                                     header_match=c.table_header_match)
                   for i in index]
        batch = collate(encoded, tok.pad_id)
        wide = (wide_batch(c.table_wide_features, [data.tables[int(i)] for i in index]),) if c.table_wide else ()
        return tuple(batch[name] for name in INPUTS) + wide  # forward's order


TABLE_MODELS = (TableTextEncoder, MafidTableEncoder)  # training mode "table"


def check_table_config(config) -> None:
    """A table encoder is built from a TableConfig (seqenc.config), not a TVMKAConfig."""
    if not isinstance(config, TableConfig):
        raise TypeError(f"a table encoder takes a TableConfig (seqenc.config), not a {type(config).__name__}")


def table_encoder(config: TableConfig) -> TableTextEncoder | MafidTableEncoder:
    """The table model ``config.table_attention`` names: MAFiD's own model, else the encoder here."""
    check_table_config(config)
    return MafidTableEncoder(config) if config.table_attention == "mafid" else TableTextEncoder(config)


def _tableformer_core(q, k, v, dropout_p, training, scalars, relations, attention_mask, block):
    return tableformer_attention(q, k, v, scalars, relations, attention_mask, block, dropout_p, training)


def _mate_core(q, k, v, dropout_p, training, layout, n_row_heads):
    return mate_attention(q, k, v, layout, n_row_heads, dropout_p, training)
