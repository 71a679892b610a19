"""MAFiD's layers (Lee et al., 2023, "Moving Average Equipped Fusion-in-Decoder") and a MAFiD-style
table-text classifier built from them.

Layers (selectable, as the attention variants are):

* :class:`CrossAttention`: multi-head attention of queries x over a context (the attention
  core of seqenc.attention; the one mask convention, converted by ``additive_mask``);
* :class:`GatedCrossAttention`: x + tanh(gate) * CrossAttention(x, context), the gate a learnable
  vector initialised at 0, so the layer starts closed (the input passes unchanged) -- MAFiD's
  Eq. 5 after Flamingo (Alayrac et al., 2022);
* single-row attention: seqenc.attention.SelfAttention with one head (MAFiD's SHA, Eq. 2);
* the low-dimensional EMA: seqenc.ema.LowDimEMA (Eq. 3-4).

:class:`MafidTableEncoder` (training mode ``table``, ``table_attention = "mafid"``) follows the
paper's Figure 1 for a text and a table, with a classification head where the paper decodes:

1. *independent encoding* (FiD): every row r becomes its own sequence ``[CLS] text [SEP] h_1 c_1
   h_2 c_2 ... [SEP]`` (header names before their cells; the text repeated per row, as FiD
   repeats the question per passage), encoded by one shared BERT stack -> C_r;
2. *single-row reasoning*: C_r^(1) = SHA(C_r) inside each row;
3. *multi-row reasoning*: the rows' C^(1) concatenated into one long sequence, through the
   low-dimensional EMA -> C^(2) (``mafid_ema``: "lowdim", "full" (K = 1) or "none");
4. *gated fusion*: C~ = C + tanh(p) * C^(1); a learned query G reads C~ by cross-attention
   (residual + LayerNorm, as the decoder layer around MAFiD's Eq. 5), then G2 = G1 + tanh(q) *
   CrossAttention(G1, C^(2)); the task head reads G2. ``mafid_gate = False`` (the ablation)
   replaces tanh(p), tanh(q) by 1.

Choices where the paper is vague: TabFact has no passages, so a row's block is its cells only
(the paper's b_P is empty); the decoder's queries become one learned query vector (a classifier
needs one output); a row keeps the table's header names (a row without them loses its
columns' meaning); the rows kept are those the flattened encoders keep within
``max_table_tokens`` (seqenc.table_inputs), so every variant sees the same cells, and each row
block is cut to ``max_positions`` tokens.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from seqenc.attention import SelfAttention, additive_mask
from seqenc.config import TableConfig, plain_config
from seqenc.ema import LowDimEMA
from seqenc.heads import WideHead, make_head
from seqenc.model import Embeddings, Encoder, SaveLoadMixin, init_weights
from seqenc.table_checks import WIDE_FEATURES, wide_batch
from seqenc.table_inputs import NO_MATCH, NO_NUMBER, match_vocabulary, table_pieces
from seqenc.table_numbers import NumericEmbeddings
from seqenc.tokenizer import ValueTokenizer

MAFID_EMAS = ("lowdim", "full", "none")


class CrossAttention(SelfAttention):
    """Queries x [B, Lq, d] over context [B, Lc, d] (mask [B, Lc] bool) -> [B, Lq, d]: the
    self-attention layer's private heads with keys and values from the context."""

    def __init__(self, config: TableConfig):
        super().__init__(config, None, 0.0)

    def forward(self, x: torch.Tensor, context: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return super().forward(x, additive_mask(mask, x.dtype), context=context)


class GatedCrossAttention(nn.Module):
    """x + tanh(gate) * CrossAttention(x, context); the gate [d_model] starts at 0 (closed)."""

    def __init__(self, config: TableConfig, gated: bool = True):
        super().__init__()
        self.attn = CrossAttention(config)
        self.gate = nn.Parameter(torch.zeros(config.d_model)) if gated else None

    def forward(self, x: torch.Tensor, context: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        update = self.attn(x, context, mask)
        return x + (torch.tanh(self.gate) * update if self.gate is not None else update)


def row_blocks(tok: ValueTokenizer, text: str, header: list[str], rows: list[list[str]], config: TableConfig):
    """One example -> its row blocks (step 1 of the module docstring): a list over rows of
    (input_ids, token_type_ids, match_ids, numeric_ids); at least one block (a table without rows:
    the header's). match_ids and numeric_ids are seqenc.table_inputs' features of the same tokens."""
    t = table_pieces(tok, text, header, rows, max_len=config.max_table_tokens,
                     max_text_tokens=config.max_text_tokens, max_cell_tokens=config.max_cell_tokens,
                     max_rows=config.max_rows, max_columns=config.max_columns, row_match=config.table_row_match,
                     row_count=config.table_row_count,
                     header_match=config.table_header_match)
    blocks = []
    empty = [[[] for _ in t.header]]  # a table without rows: one block of its header
    no_numbers = [[NO_NUMBER] * len(t.header)]
    for row, row_match, row_numeric in zip(t.rows or empty, t.rows_match or empty, t.rows_numeric or no_numbers):
        table = [i for name, cell in zip(t.header, row) for i in name + cell]
        match = [m for name, cell in zip(t.header_match, row_match) for m in name + cell]
        numeric = [x for name, cell, n in zip(t.header, row, row_numeric) for x in [NO_NUMBER] * len(name) + [n] * len(cell)]
        ids = (t.text + table)[:config.max_positions - 1] + [tok.sep_id]
        token_type = [0] * len(t.text) + [1] * (len(ids) - len(t.text))
        blocks.append((ids, token_type, (t.text_match + match)[:len(ids) - 1] + [NO_MATCH],
                       ([NO_NUMBER] * len(t.text) + numeric)[:len(ids) - 1] + [NO_NUMBER]))
    return blocks


class MafidTableEncoder(SaveLoadMixin, nn.Module):
    """Text + table as per-row blocks -> MAFiD's encoding, reasoning and gated fusion -> task head."""

    config_class = TableConfig

    def __init__(self, config: TableConfig):
        super().__init__()
        if not isinstance(config, TableConfig):
            raise TypeError(f"a table encoder takes a TableConfig (seqenc.config), not a {type(config).__name__}")
        self.config = config = plain_config(config)
        if config.mafid_ema not in MAFID_EMAS:
            raise ValueError(f"mafid_ema={config.mafid_ema!r} is not one of {MAFID_EMAS}")
        self.embeddings = Embeddings(config)
        self.match = nn.Embedding(match_vocabulary(config.table_row_match, config.table_header_match), config.d_model) \
            if config.table_match else None
        self.numeric = NumericEmbeddings(config.d_model) if config.table_numeric else None
        self.encoder = Encoder(config, None, 0.0)
        self.single_row = SelfAttention(dataclasses.replace(config, n_heads=1), None, 0.0)
        reduction = config.mafid_reduction if config.mafid_ema == "lowdim" else 1
        self.multi_row = LowDimEMA(config.d_model, reduction) if config.mafid_ema != "none" else None
        self.query = nn.Parameter(torch.zeros(config.d_model))
        self.read = CrossAttention(config)
        self.read_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.fuse = GatedCrossAttention(config, gated=config.mafid_gate) if self.multi_row is not None else None
        self.row_gate = nn.Parameter(torch.zeros(config.d_model)) if config.mafid_gate else None
        self.head = make_head(config)
        # intermediate pre-training's head (training.engine.table_pretrain): true / false lookup statements
        self.lookup_head = nn.Linear(config.d_model, 2) if config.table_lookup_head else None
        self.wide = WideHead(WIDE_FEATURES[config.table_wide_features][1], config.n_outputs,
                             config.table_wide_head) \
            if config.table_wide else None  # wide and deep
        init_weights(self, config.init_std)
        nn.init.normal_(self.query, std=config.init_std)
        if self.numeric is not None:
            self.numeric.reset_parameters()  # zero at init (seqenc.table_numbers)
        if self.wide is not None:
            self.wide.reset_parameters()

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, match_ids: torch.Tensor,
                numeric_ids: torch.Tensor, attention_mask: torch.Tensor, overlap: torch.Tensor | None = None):
        # [B, R, Lr] each (R rows of Lr tokens; numeric_ids [B, R, Lr, 3]; overlap: the wide features [B, F] with
        # table_wide) -> [B, n_outputs]
        logits = self.head(self.encode(input_ids, token_type_ids, match_ids, numeric_ids, attention_mask))
        return logits + self.wide(overlap) if self.wide is not None else logits

    def lookup_logits(self, *inputs) -> torch.Tensor:
        """``forward``'s inputs -> [B, 2]: the lookup head (``table_lookup_head``) on G2."""
        return self.lookup_head(self.encode(*inputs[:5]))

    def encode(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, match_ids: torch.Tensor,
               numeric_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        # [B, R, Lr] each (R rows of Lr tokens) -> [B, d_model]: the fused query G2
        B, R, Lr = input_ids.shape
        flat_mask = attention_mask.view(B * R, Lr).clone()
        flat_mask[:, 0] = True  # a padding row (an example with fewer rows) attends to something; never read
        extra = self.match(match_ids.view(B * R, Lr)) if self.match is not None else None
        if self.numeric is not None:
            numeric = self.numeric(numeric_ids.view(B * R, Lr, 3))
            extra = numeric if extra is None else extra + numeric
        C = self.encoder(self.embeddings(input_ids.view(B * R, Lr), token_type_ids.view(B * R, Lr), extra), flat_mask)
        C1 = self.single_row(C, additive_mask(flat_mask, C.dtype))  # [B R, Lr, d]
        C, C1, mask = C.view(B, R * Lr, -1), C1.reshape(B, R * Lr, -1), attention_mask.view(B, R * Lr)
        mixed = C + (torch.tanh(self.row_gate) * C1 if self.row_gate is not None else C1)  # C~ of Eq. 5
        G = self.query.expand(B, 1, -1)
        G = self.read_norm(G + self.read(G, mixed, mask))  # G^(1)
        if self.multi_row is not None:
            G = self.fuse(G, self.multi_row(C1, mask), mask)  # G^(2) = G^(1) + tanh(q) * MHA(G^(1), C^(2))
        return G[:, 0]

    def batch_inputs(self, data, index, tok: ValueTokenizer) -> tuple[torch.Tensor, ...]:
        """``forward``'s inputs for the examples ``index`` of ``data`` (seqenc.table_model.TableExamples)."""
        blocks = pad_row_blocks([row_blocks(tok, *data.tables[int(i)], self.config) for i in index], tok.pad_id)
        c = self.config
        return blocks + ((wide_batch(c.table_wide_features, [data.tables[int(i)] for i in index]),) if c.table_wide else ())


def pad_row_blocks(blocks: list, pad_id: int) -> tuple[torch.Tensor, ...]:
    """Examples' row blocks (:func:`row_blocks`) -> ``forward``'s (input_ids, token_type_ids,
    match_ids, numeric_ids, attention_mask), each [B, R, Lr] (numeric_ids [B, R, Lr, 3]): padded
    to the batch's most rows R and longest block Lr."""
    R = max(len(b) for b in blocks)
    Lr = max(len(block[0]) for b in blocks for block in b)
    ids = torch.full((len(blocks), R, Lr), pad_id, dtype=torch.long)
    types, match = torch.zeros_like(ids), torch.zeros_like(ids)
    numeric = torch.zeros(len(blocks), R, Lr, 3, dtype=torch.long)
    for b, rows in enumerate(blocks):
        for r, (row_ids, row_types, row_match, row_numeric) in enumerate(rows):
            ids[b, r, :len(row_ids)] = torch.tensor(row_ids)
            types[b, r, :len(row_types)] = torch.tensor(row_types)
            match[b, r, :len(row_match)] = torch.tensor(row_match)
            numeric[b, r, :len(row_numeric)] = torch.tensor(row_numeric)
    return ids, types, match, numeric, ids != pad_id
