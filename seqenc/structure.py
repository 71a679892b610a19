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
    reused by every layer. Positions are those of the input; the sorted order only decides which
    tokens go where:

    * ``query_index``: the global section's G queries [B, G], then (when n > 0) the long part's n
      buckets of ``radius`` [B, n R] (the last one padded with filler queries, whose outputs are
      dropped);
    * ``key_index``: the global section's keys, every token in input order [B, L], then (when
      n > 0) each bucket's keys [B, n (G + 3R)], the global section and buckets b-1, b, b+1 side
      by side (filler keys point at any token: the bias masks them);
    * ``output_index`` [B, L]: where each input token's output lies in the G + n R outputs;
    * ``global_bias`` [B, 1, G, L] (keys in input order) and ``long_bias`` [B n, 1, R, G + 3R]."""

    G: int
    n: int
    radius: int
    query_index: tuple[torch.Tensor, ...]
    key_index: tuple[torch.Tensor, ...]
    output_index: torch.Tensor
    global_bias: torch.Tensor
    long_bias: torch.Tensor | None


def mate_view(ids, segment, attention_mask, global_len: int, radius: int, dtype: torch.dtype) -> MateView:
    B, L = ids.shape
    device = ids.device
    order = _sort_order(ids, segment, attention_mask)  # [B, L]: sorted position -> input position
    inverse = torch.argsort(order, dim=1)  # input position -> sorted position
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
    pos = torch.arange(L, device=device).expand(B, L)  # sorted positions
    global_bias = bias(allowed(pos[:, :G], inverse))[:, None]  # [B, 1, G, L], keys in input order
    if G == L:
        return MateView(G, 0, radius, (order,), (pos,), inverse, global_bias, None)
    n = -(-(L - G) // radius)
    filler = lambda k: torch.full((B, k), -1, device=device, dtype=pos.dtype)  # noqa: E731
    lp = torch.cat([pos[:, G:], filler(n * radius - (L - G))], 1)  # [B, n R], -1: filler
    lkp = torch.cat([filler(radius), lp, filler(radius)], 1)  # the keys: one empty bucket on either side
    win = torch.arange(n, device=device)[:, None] * radius + torch.arange(3 * radius, device=device)  # [n, 3R]
    wpos, qpos = lkp[:, win], lp.view(B, n, radius)  # [B, n, 3R], [B, n, R]
    g_ok = allowed(qpos.clamp(min=0), pos[:, None, :G].expand(B, n, G))  # [B, n, R, G]
    w_ok = allowed(qpos.clamp(min=0), wpos.clamp(min=0)) & (wpos >= 0)[:, :, None, :]  # [B, n, R, 3R]
    long_bias = bias(torch.cat([g_ok, w_ok], -1)).view(B * n, 1, radius, G + 3 * radius)  # a bucket a row
    to_input = lambda p: order.gather(1, p.clamp(min=0).flatten(1)).view_as(p)  # noqa: E731  sorted -> input
    keys = torch.cat([pos[:, None, :G].expand(B, n, G), wpos], -1)  # [B, n, G + 3R] sorted positions
    return MateView(G, n, radius, (order[:, :G], to_input(lp)), (pos, to_input(keys).flatten(1)), inverse,
                    global_bias, long_bias)


def mate_layout(row_ids, col_ids, segment, attention_mask, n_row_heads: int, n_heads: int, global_len: int,
                radius: int, dtype: torch.dtype = torch.float32) -> tuple[MateView | None, MateView | None]:
    """(row view, column view) of an input: None for a view no head uses."""
    rows = mate_view(row_ids, segment, attention_mask, global_len, radius, dtype) if n_row_heads else None
    cols = mate_view(col_ids, segment, attention_mask, global_len, radius, dtype) if n_row_heads < n_heads else None
    return rows, cols


def _bucketed(queries, keys, values, view: MateView, dropout_p: float, training: bool) -> torch.Tensor:
    """Figure 2 of MATE for one group of heads sharing a view, on the rows gathered by the view's
    indices (``queries``: [B, G, h, d] and [B, n R, h, d]; ``keys`` / ``values``: [B, L, h, d] and
    [B, n (G + 3R), h, d]) -> the outputs [B, L, h, d] in input order."""
    G, n, R = view.G, view.n, view.radius
    p = dropout_p if training else 0.0
    # the global section attends to everything: [B, h, G, d] (PyTorch's fused core, scaled 1 / sqrt(d))
    out_global = F.scaled_dot_product_attention(queries[0].transpose(1, 2), keys[0].transpose(1, 2),
                                                values[0].transpose(1, 2), attn_mask=view.global_bias,
                                                dropout_p=p).transpose(1, 2)
    if n == 0:
        return _gather_rows(out_global, view.output_index)
    # the long part, a bucket a batch row (4-D, so the fused core serves it too); each bucket
    # sees the global section and buckets b-1, b, b+1: its G + 3R keys laid side by side
    B, _, h, d = queries[1].shape
    lq = queries[1].view(B * n, R, h, d).transpose(1, 2)  # [B n, h, R, d]
    kw, vw = (t[1].view(B * n, G + 3 * R, h, d).transpose(1, 2) for t in (keys, values))
    out_long = F.scaled_dot_product_attention(lq, kw, vw, attn_mask=view.long_bias, dropout_p=p)  # [B n, h, R, d]
    out = torch.cat([out_global, out_long.transpose(1, 2).reshape(B, n * R, h, d)], 1)  # [B, G + n R, h, d]
    return _gather_rows(out, view.output_index)


def mate_attention(q, k, v, layout: tuple[MateView | None, MateView | None], n_row_heads: int,
                   dropout_p: float = 0.0, training: bool = False) -> torch.Tensor:
    """MATE's efficient attention (module docstring): q, k, v [B, h, L, d] -> [B, h, L, d];
    heads [0, n_row_heads) through the row view of ``layout`` (:func:`mate_layout`), the
    others through the column view. Every sort, bucket and window is one gather of rows in the
    [B, L, h, d] layout (the projections' own: contiguous h * d per token), both views at once."""
    groups = [(view, heads) for view, heads in ((layout[0], slice(0, n_row_heads)),
                                                (layout[1], slice(n_row_heads, q.size(1)))) if view is not None]
    heads = tuple(h for _, h in groups)

    def gather(t, field):  # -> per group, the tuple of its gathered tensors
        sizes = [len(getattr(view, field)) for view, _ in groups]
        flat = _GatherHeads.apply(t.transpose(1, 2), tuple(getattr(view, field) for view, _ in groups), heads)
        return [flat[sum(sizes[:i]):sum(sizes[:i + 1])] for i in range(len(groups))]

    queries, keys, values = gather(q, "query_index"), gather(k, "key_index"), gather(v, "key_index")
    parts = [_bucketed(qg, kg, vg, view, dropout_p, training)
             for (view, _), qg, kg, vg in zip(groups, queries, keys, values)]
    return (torch.cat(parts, 2) if len(parts) > 1 else parts[0]).transpose(1, 2)


def _flat_rows(index: torch.Tensor, L: int) -> torch.Tensor:
    """[B, M] row indices per batch row -> [B M] indices into the rows of a [B L, ...] tensor."""
    return (index + torch.arange(index.size(0), device=index.device)[:, None] * L).flatten()


class _GatherHeads(torch.autograd.Function):
    """t [B, L, h, d] -> for each group g and each index i of ``indices[g]``: t[b, i[b], heads[g]]
    [B, M, h_g, d], all in one flat tuple. A row may be taken many times (a key sits in up to three
    windows and the global section's keys in all); the backward adds every output's gradients into
    one tensor with ``index_add_``. (Autograd's own, through head slices and advanced indexing,
    would zero and add a full-size tensor per slice.)"""

    @staticmethod
    def forward(ctx, t: torch.Tensor, indices: tuple, heads: tuple):
        B, L, h, d = t.shape
        rows = t.reshape(B * L, h, d)
        ctx.plan = [(s, _flat_rows(i, L)) for group, s in zip(indices, heads) for i in group]
        ctx.heads, ctx.shape = heads, t.shape
        return tuple(rows[:, s].index_select(0, flat).view(B, -1, len(range(h)[s]), d) for s, flat in ctx.plan)

    @staticmethod
    def backward(ctx, *grads):
        B, L, h, d = ctx.shape
        # a buffer per group (index_add_ into a head slice is slow), then laid side by side
        parts = {s.start: grads[0].new_zeros(B * L, len(range(h)[s]), d) for s in ctx.heads}
        for grad, (s, flat) in zip(grads, ctx.plan):
            if grad is not None:
                parts[s.start].index_add_(0, flat, grad.reshape(flat.numel(), -1, d))
        rows = torch.cat(list(parts.values()), 1) if len(parts) > 1 else next(iter(parts.values()))
        return rows.view(B, L, h, d), None, None


def _gather_rows(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """t [B, L, h, d] -> t[b, index[b]] [B, M, h, d] (:class:`_GatherHeads` with one group of every head)."""
    return _GatherHeads.apply(t, ((index,),), (slice(0, t.size(2)),))[0]


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
    key padding) -> additive bias [B, h, L, L].

    The scalar is ``scale * w`` with ``w`` the parameter (``scale``: TableConfig.tableformer_bias_scale).
    Why: Adam moves a parameter by about the learning rate per update whatever its gradient's
    size, so at 1e-3 a bias needs ~1,000 updates to reach 1 -- too slow to matter in a short
    run, where the "same row" bias is what a TableFormer has instead of row embeddings (on the
    tiny lookup task, tests/test_table_learning.py, it stayed at chance with scale 1). ``scale``
    multiplies its pace; zero at init either way (the paper)."""

    def __init__(self, n_heads: int, scale: float = 1.0):
        super().__init__()
        self.scale = scale
        self.scalars = nn.Embedding(len(RELATIONS), n_heads)
        nn.init.zeros_(self.scalars.weight)

    @property
    def weight(self) -> torch.Tensor:
        """[13, h]: the scalars themselves (scale applied)."""
        return self.scalars.weight * self.scale

    def forward(self, relations: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        bias = F.embedding(relations, self.weight).permute(0, 3, 1, 2)  # [B, h, L, L]
        return bias.masked_fill(~attention_mask[:, None, None, :], _neg(bias.dtype))
