"""Table structure inside attention: MATE's row and column heads, TableFormer's relation biases.

A table-text input is one token sequence: the text (a statement, with [CLS] / [SEP]) followed by
the flattened table, header row first. Every token carries (seqenc.table_inputs builds them):

* ``segment`` [B, L]: ``TEXT`` (0), ``HEADER`` (1) or ``CELL`` (2);
* ``row_ids`` [B, L]: 0 for text and header tokens, 1.. for the data rows;
* ``col_ids`` [B, L]: 0 for text, 1.. for the table's columns;
* ``attention_mask`` [B, L] bool, True for real tokens (seqenc.attention's one mask convention).

**MATE** (Eisenschlos et al., 2021, section 3). The first ``n_row_heads`` heads are row heads, the
others column heads. The text is MATE's global part Q: a text token attends to every token and
every token attends to the text; a table token of a row head attends to the table tokens of its
row, of a column head to those of its column (the paper's A_ik). Two implementations that give
the same output:

* :func:`mate_mask`: the reference, an additive bias [B, h, L, L] for the ordinary attention
  core (quadratic memory and time);
* :func:`mate_attention`: the efficient one of the paper's Figure 2 and Appendix D. Per head
  group, the tokens are sorted (text first, then table tokens by row -- or column -- id, padding
  last); the first ``global_len`` sorted tokens form the global section, which attends to and
  from everything; the rest is cut into buckets of ``radius`` tokens, and each bucket attends to
  the global section and to itself and its two neighbour buckets (3 x radius keys), with the
  row / column rule applied as a mask inside that window. Memory and time are linear in L for a
  fixed radius. It equals :func:`mate_mask` when the global section holds all the text and a
  row / column has at most ``radius`` tokens (then all of it lies within neighbouring buckets);
  tests/test_structure.py checks this on random tables. Choices where the paper is vague: the
  rule is also applied inside the global section (a table token that lands there because the
  text is shorter than ``global_len`` still attends only to the text and its own row / column),
  so the two agree for any ``global_len`` at least the text's length; padding queries attend like
  text tokens (their output is never read).

**TableFormer** (Yang et al., 2022, section 3). No row / column embeddings and per-cell positions
(seqenc.table_inputs); structure enters only as one learnable scalar per head and relation,
added to the scaled scores (the paper's Eq. 3: after the scaling). :func:`table_relations` gives
the 13 relations of the paper's list: ``others`` (0) and the 12 named ones below. Where several
apply, the most specific wins (a token pair in one cell is ``same cell``, not ``same row``);
[CLS] / [SEP] count as sentence tokens; the biases start at zero (the paper's init).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

TEXT, HEADER, CELL = 0, 1, 2

# TableFormer's relations (the paper's list; 0 = "others")
RELATIONS = ("others", "same row", "same column", "same cell", "cell to column header", "cell to sentence",
             "header to column cell", "header to other header", "header to same header", "header to sentence",
             "sentence to cell", "sentence to header", "sentence to sentence")
(OTHERS, SAME_ROW, SAME_COLUMN, SAME_CELL, CELL_TO_HEADER, CELL_TO_SENTENCE, HEADER_TO_CELL, HEADER_TO_OTHER_HEADER,
 HEADER_TO_SAME_HEADER, HEADER_TO_SENTENCE, SENTENCE_TO_CELL, SENTENCE_TO_HEADER, SENTENCE_TO_SENTENCE) = range(13)


def _neg(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).min


# --- MATE ------------------------------------------------------------------------------------
def mate_allowed(ids: torch.Tensor, segment: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, L, L] bool: may query i attend to key j under one view (``ids``: row or column ids).
    A text (or padding) query attends to every real key; any query to the text; a table token
    to the table tokens that share its id."""
    text_q = (segment == TEXT) | ~attention_mask  # [B, L]
    text_k = segment == TEXT
    same = ids[:, :, None] == ids[:, None, :]  # [B, L, L]
    return attention_mask[:, None, :] & (text_q[:, :, None] | text_k[:, None, :] | same)


def mate_mask(row_ids, col_ids, segment, attention_mask, n_heads: int, n_row_heads: int,
              dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """MATE as an additive bias [B, h, L, L] (0 where attention is allowed, a large negative
    elsewhere): heads [0, n_row_heads) see rows, the others columns."""
    rows = mate_allowed(row_ids, segment, attention_mask)
    cols = mate_allowed(col_ids, segment, attention_mask)
    allowed = torch.cat([rows[:, None].expand(-1, n_row_heads, -1, -1),
                         cols[:, None].expand(-1, n_heads - n_row_heads, -1, -1)], dim=1)
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, _neg(dtype))


def _sort_order(ids: torch.Tensor, segment: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, L] the token order of one view: text first, then table tokens by id, padding last;
    ties keep the input order."""
    L = ids.size(1)
    group = torch.where(segment == TEXT, torch.zeros_like(ids), ids + 1)
    group = torch.where(attention_mask, group, torch.full_like(ids, 2**40 // max(L, 1)))
    return torch.argsort(group * L + torch.arange(L, device=ids.device), dim=1)


@dataclass
class MateView:
    """One view (rows or columns) of MATE's efficient attention, laid out once per input and
    reused by every layer: the sort ``order`` [B, L] and its ``inverse``, the global section ``G``, ``n`` buckets of
    ``radius`` (the long part padded by ``extra``) and the additive masks of the global queries
    [B, 1, G, L] and the long queries [B n, 1, R, G + 3R] (keys: G global, then buckets b-1, b, b+1)."""

    order: torch.Tensor
    inverse: torch.Tensor
    G: int
    n: int
    radius: int
    extra: int
    global_bias: torch.Tensor
    long_bias: torch.Tensor | None


def mate_view(ids, segment, attention_mask, global_len: int, radius: int, dtype: torch.dtype) -> MateView:
    B, L = ids.shape
    device = ids.device
    order = _sort_order(ids, segment, attention_mask)  # [B, L]
    inverse = torch.argsort(order, dim=1)  # position of each input token in the sorted order
    ids, real = ids.gather(1, order), attention_mask.gather(1, order)
    text_k = segment.gather(1, order).eq(TEXT)
    text_q = text_k | ~real  # a padding query attends like text
    neg = _neg(dtype)

    def allowed(qi: torch.Tensor, ki: torch.Tensor) -> torch.Tensor:  # [B, ..., Q] x [B, ..., K] -> [B, ..., Q, K]
        take = lambda x, i: x.gather(1, i.flatten(1)).view_as(i)  # noqa: E731
        return take(real, ki)[..., None, :] & (take(text_q, qi)[..., :, None] | take(text_k, ki)[..., None, :]
                                               | (take(ids, qi)[..., :, None] == take(ids, ki)[..., None, :]))

    def bias(ok: torch.Tensor) -> torch.Tensor:
        return torch.zeros(ok.shape, dtype=dtype, device=device).masked_fill(~ok, neg)

    G = min(global_len, L)
    pos = torch.arange(L, device=device).expand(B, L)
    global_bias = bias(allowed(pos[:, :G], pos))[:, None]  # [B, 1, G, L]
    if G == L:
        return MateView(order, inverse, G, 0, radius, 0, global_bias, None)
    n = -(-(L - G) // radius)
    extra = n * radius - (L - G)
    filler = lambda k: torch.full((B, k), -1, device=device, dtype=pos.dtype)  # noqa: E731
    lp = torch.cat([pos[:, G:], filler(extra)], 1)  # [B, n R], -1: filler
    lkp = torch.cat([filler(radius), lp, filler(radius)], 1)  # the keys: one empty bucket on either side
    win = torch.arange(n, device=device)[:, None] * radius + torch.arange(3 * radius, device=device)  # [n, 3R]
    wpos, qpos = lkp[:, win], lp.view(B, n, radius)  # [B, n, 3R], [B, n, R]
    g_ok = allowed(qpos.clamp(min=0), pos[:, None, :G].expand(B, n, G))  # [B, n, R, G]
    w_ok = allowed(qpos.clamp(min=0), wpos.clamp(min=0)) & (wpos >= 0)[:, :, None, :]  # [B, n, R, 3R]
    long_bias = bias(torch.cat([g_ok, w_ok], -1)).view(B * n, 1, radius, G + 3 * radius)  # a bucket a row
    return MateView(order, inverse, G, n, radius, extra, global_bias, long_bias)


def mate_layout(row_ids, col_ids, segment, attention_mask, n_row_heads: int, n_heads: int, global_len: int,
                radius: int, dtype: torch.dtype = torch.float32) -> tuple[MateView | None, MateView | None]:
    """(row view, column view) of an input: None for a view no head uses."""
    rows = mate_view(row_ids, segment, attention_mask, global_len, radius, dtype) if n_row_heads else None
    cols = mate_view(col_ids, segment, attention_mask, global_len, radius, dtype) if n_row_heads < n_heads else None
    return rows, cols


def _bucketed(q, k, v, view: MateView, dropout_p: float, training: bool) -> torch.Tensor:
    """Figure 2 of MATE for one group of heads sharing a view. q, k, v: [B, L, h, d], rows in the
    view's sorted order -> the outputs [B, L, h, d] in that order."""
    B, L, h, d = q.shape
    G, n, R = view.G, view.n, view.radius
    p = dropout_p if training else 0.0
    # the global section attends to everything: [B, h, G, d] (PyTorch's fused core, scaled 1 / sqrt(d))
    out_global = F.scaled_dot_product_attention(q[:, :G].transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                attn_mask=view.global_bias, dropout_p=p).transpose(1, 2)
    if n == 0:
        return out_global
    # the long part in buckets of R, a bucket a batch row (4-D, so the fused core serves it too);
    # each bucket sees the global section and buckets b-1, b, b+1 (an empty bucket padded on
    # either side): its G + 3R keys laid side by side
    lq = F.pad(q[:, G:], (0, 0, 0, 0, 0, view.extra)).view(B * n, R, h, d).transpose(1, 2)  # [B n, h, R, d]

    def windows(t):  # [B, L, h, d] -> [B n, h, G + 3R, d]
        long = F.pad(t[:, G:], (0, 0, 0, 0, R, R + view.extra)).view(B, n + 2, R, h, d)
        glob = t[:, None, :G].expand(B, n, G, h, d)
        both = torch.cat([glob, long[:, :n], long[:, 1:n + 1], long[:, 2:]], 2)  # [B, n, G + 3R, h, d]
        return both.view(B * n, G + 3 * R, h, d).transpose(1, 2)

    out_long = F.scaled_dot_product_attention(lq, windows(k), windows(v), attn_mask=view.long_bias, dropout_p=p)
    out_long = out_long.transpose(1, 2).reshape(B, n * R, h, d)[:, :L - G]
    return torch.cat([out_global, out_long], 1)


def mate_attention(q, k, v, layout: tuple[MateView | None, MateView | None], n_row_heads: int,
                   dropout_p: float = 0.0, training: bool = False) -> torch.Tensor:
    """MATE's efficient attention (module docstring): q, k, v [B, h, L, d] -> [B, h, L, d];
    heads [0, n_row_heads) through the row view of ``layout`` (:func:`mate_layout`), the
    others through the column view. Tokens are sorted as rows of the [B, L, h, d] layout (the
    projections' own: contiguous h * d per token) and each group's outputs sorted back."""
    parts = []
    for view, heads in ((layout[0], slice(0, n_row_heads)), (layout[1], slice(n_row_heads, q.size(1)))):
        if view is not None:
            qs, ks, vs = (_PermuteRows.apply(t[:, heads].transpose(1, 2), view.order, view.inverse) for t in (q, k, v))
            out = _bucketed(qs, ks, vs, view, dropout_p, training)  # [B, L, h', d], sorted
            parts.append(_PermuteRows.apply(out, view.inverse, view.order))
    return (torch.cat(parts, 2) if len(parts) > 1 else parts[0]).transpose(1, 2)


class _PermuteRows(torch.autograd.Function):
    """t [B, L, ...] -> t[b, order[b]] for a permutation ``order``; the backward gathers the
    gradient with the ``inverse`` permutation (every row moves exactly once: no scatter-add)."""

    @staticmethod
    def forward(ctx, t: torch.Tensor, order: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(inverse)
        return _rows(t, order)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (inverse,) = ctx.saved_tensors
        return _rows(grad, inverse), None, None


def _rows(t: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    return t[torch.arange(t.size(0), device=t.device)[:, None], order]


# --- TableFormer ------------------------------------------------------------------------------
def table_relations(row_ids, col_ids, segment, queries: slice | None = None) -> torch.Tensor:
    """[B, Lq, L] long: the TableFormer relation (RELATIONS index) of query i to key j, for the
    queries ``queries`` (default: all)."""
    q = queries or slice(None)
    si, sj = segment[:, q, None], segment[:, None, :]
    same_row = row_ids[:, q, None] == row_ids[:, None, :]
    same_col = col_ids[:, q, None] == col_ids[:, None, :]
    rel = torch.full(same_row.shape, OTHERS, dtype=torch.long, device=segment.device)
    rules = [  # (condition, relation): later rules are more specific and win
        ((si == TEXT) & (sj == TEXT), SENTENCE_TO_SENTENCE),
        ((si == TEXT) & (sj == HEADER), SENTENCE_TO_HEADER),
        ((si == TEXT) & (sj == CELL), SENTENCE_TO_CELL),
        ((si == HEADER) & (sj == TEXT), HEADER_TO_SENTENCE),
        ((si == CELL) & (sj == TEXT), CELL_TO_SENTENCE),
        ((si == HEADER) & (sj == HEADER), HEADER_TO_OTHER_HEADER),
        ((si == HEADER) & (sj == HEADER) & same_col, HEADER_TO_SAME_HEADER),
        ((si == HEADER) & (sj == CELL) & same_col, HEADER_TO_CELL),
        ((si == CELL) & (sj == HEADER) & same_col, CELL_TO_HEADER),
        ((si == CELL) & (sj == CELL) & same_row, SAME_ROW),
        ((si == CELL) & (sj == CELL) & same_col, SAME_COLUMN),
        ((si == CELL) & (sj == CELL) & same_row & same_col, SAME_CELL),
    ]
    for condition, relation in rules:
        rel = rel.masked_fill(condition, relation)
    return rel


def compact_relations(row_ids, col_ids, segment, block: int) -> torch.Tensor:
    """[B, L, L] uint8: :func:`table_relations` built ``block`` queries at a time (one byte a
    pair, computed once per input and shared by every layer)."""
    B, L = segment.shape
    out = torch.empty(B, L, L, dtype=torch.uint8, device=segment.device)
    for start in range(0, L, block):
        out[:, start:start + block] = table_relations(row_ids, col_ids, segment, slice(start, start + block))
    return out


def tableformer_attention(q, k, v, scalars: torch.Tensor, relations: torch.Tensor, attention_mask, block: int,
                          dropout_p: float = 0.0, training: bool = False) -> torch.Tensor:
    """TableFormer's attention a block of ``block`` queries at a time: q, k, v [B, h, L, d] ->
    [B, h, L, d], ``relations`` from :func:`compact_relations`, ``scalars`` [13, h] the layer's.
    Each block gathers its bias [B, h, block, L], attends, and is recomputed in the backward
    pass (activation checkpointing), so no [h, L, L] tensor ever exists: memory grows with
    L x block (and L^2 bytes for the relations), not h L^2 floats. Equal to the whole bias
    (TableFormerBias) up to float rounding."""
    from torch.utils.checkpoint import checkpoint

    keep = attention_mask[:, None, None, :]

    def one_block(qb, k, v, scalars, start: int):
        rel = relations[:, start:start + qb.size(2)].long()  # [B, b, L]
        bias = F.embedding(rel, scalars).permute(0, 3, 1, 2)  # [B, h, b, L]
        bias = bias.masked_fill(~keep, _neg(bias.dtype))
        return F.scaled_dot_product_attention(qb, k, v, attn_mask=bias, dropout_p=dropout_p if training else 0.0)

    outs = []
    for start in range(0, q.size(2), block):
        qb = q[:, :, start:start + block]
        outs.append(checkpoint(one_block, qb, k, v, scalars, start, use_reentrant=False)
                    if torch.is_grad_enabled() else one_block(qb, k, v, scalars, start))
    return torch.cat(outs, 2)


class TableFormerBias(nn.Module):
    """One learnable scalar per head and relation, zero at init: relations [B, L, L] (and the
    key padding) -> additive bias [B, h, L, L]."""

    def __init__(self, n_heads: int):
        super().__init__()
        self.scalars = nn.Embedding(len(RELATIONS), n_heads)
        nn.init.zeros_(self.scalars.weight)

    def forward(self, relations: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        bias = self.scalars(relations).permute(0, 3, 1, 2)  # [B, h, L, L]
        return bias.masked_fill(~attention_mask[:, None, None, :], _neg(bias.dtype))
