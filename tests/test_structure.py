"""seqenc.structure: MATE's efficient attention equals its mask, and TableFormer's relations."""

import pytest
import torch

from seqenc.attention import eager_attention
from seqenc.structure import (
    CELL,
    HEADER,
    RELATIONS,
    SAME_CELL,
    SAME_ROW,
    SENTENCE_TO_HEADER,
    TEXT,
    mate_attention,
    mate_layout,
    mate_mask,
    table_relations,
)


def random_tables(batch: int, seed: int, max_rows: int = 6, max_cols: int = 5, max_text: int = 7):
    """Token structure of random table-text inputs: text, header, rows of cells of 1-3 tokens,
    then padding to the longest; returns (row_ids, col_ids, segment, attention_mask)."""
    g = torch.Generator().manual_seed(seed)
    seqs = []
    for _ in range(batch):
        n_text = int(torch.randint(1, max_text + 1, (1,), generator=g))
        rows, cols = (int(torch.randint(1, m + 1, (1,), generator=g)) for m in (max_rows, max_cols))
        toks = [(0, 0, TEXT)] * n_text
        for r in range(rows + 1):  # row 0: the header
            for c in range(1, cols + 1):
                toks += [(r, c, HEADER if r == 0 else CELL)] * int(torch.randint(1, 4, (1,), generator=g))
        seqs.append(toks)
    L = max(len(s) for s in seqs)
    out = torch.zeros(3, batch, L, dtype=torch.long)
    mask = torch.zeros(batch, L, dtype=torch.bool)
    for b, toks in enumerate(seqs):
        out[:, b, :len(toks)] = torch.tensor(toks).T
        mask[b, :len(toks)] = True
    return out[0], out[1], out[2], mask


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("n_row", [0, 1, 2, 4])  # column heads only, an uneven split, half, row heads only
def test_efficient_mate_equals_the_masked_reference(seed, n_row):
    row_ids, col_ids, segment, mask = random_tables(3, seed)
    B, L = mask.shape
    h, d = 4, 8
    g = torch.Generator().manual_seed(100 + seed)
    q, k, v = (torch.randn(B, h, L, d, generator=g) for _ in range(3))
    reference = eager_attention(q, k, v, mate_mask(row_ids, col_ids, segment, mask, h, n_row), 0.0, False)
    longest_group = max(int((ids[b][segment[b] != TEXT] == i).sum()) for ids in (row_ids, col_ids)
                        for b in range(B) for i in ids[b].unique())
    max_text = int((segment == TEXT).logical_and(mask).sum(1).max())
    for global_len, radius in ((max_text, longest_group), (max_text + 3, longest_group + 2), (L, 1)):
        fast = mate_attention(q, k, v, mate_layout(row_ids, col_ids, segment, mask, n_row, h, global_len, radius), n_row)
        diff = (fast - reference).abs()[mask[:, None, :, None].expand_as(fast)]
        assert diff.max() <= 1e-5, (global_len, radius, diff.max())
    # a radius smaller than a row / column drops pairs: the two differ (the condition is needed)
    short = mate_attention(q, k, v, mate_layout(row_ids, col_ids, segment, mask, n_row, h, max_text, 1), n_row)
    assert (short - reference).abs()[mask[:, None, :, None].expand_as(short)].max() > 1e-3


@pytest.mark.parametrize("seed", range(3))
def test_efficient_mate_has_the_masked_references_gradients(seed):
    """The sort and its inverse (a custom backward), the buckets and the fused core: the
    gradients of q, k and v at the real tokens equal the reference's (<= 1e-5)."""
    row_ids, col_ids, segment, mask = random_tables(3, seed)
    B, L = mask.shape
    h, d, n_row = 4, 8, 3
    g = torch.Generator().manual_seed(200 + seed)
    qkv = [torch.randn(B, h, L, d, generator=g) for _ in range(3)]
    weight = torch.randn(B, h, L, d, generator=g) * mask[:, None, :, None]  # a loss that reads real tokens only
    longest_group = max(int((ids[b][segment[b] != TEXT] == i).sum()) for ids in (row_ids, col_ids)
                        for b in range(B) for i in ids[b].unique())
    max_text = int((segment == TEXT).logical_and(mask).sum(1).max())
    layout = mate_layout(row_ids, col_ids, segment, mask, n_row, h, max_text, longest_group)
    grads = []
    for attend in (lambda q, k, v: eager_attention(q, k, v, mate_mask(row_ids, col_ids, segment, mask, h, n_row),
                                                   0.0, False),
                   lambda q, k, v: mate_attention(q, k, v, layout, n_row)):
        leaves = [t.clone().requires_grad_() for t in qkv]
        (attend(*leaves) * weight).sum().backward()
        grads.append([t.grad for t in leaves])
    real = mask[:, None, :, None].expand(B, h, L, d)
    for reference, fast in zip(*grads):
        assert (fast - reference).abs()[real].max() <= 1e-5


def test_mate_mask_follows_the_papers_rule():
    row_ids, col_ids, segment, mask = random_tables(1, 7)
    bias = mate_mask(row_ids, col_ids, segment, mask, n_heads=2, n_row_heads=1)[0]  # [h, L, L]
    ok = bias == 0
    text = (segment[0] == TEXT).nonzero().flatten()
    table = (segment[0] != TEXT).nonzero().flatten()
    assert ok[:, text][:, :, mask[0]].all() and ok[:, :, text][:, mask[0]].all()  # text attends and is attended
    for i in table:
        for j in table:
            assert bool(ok[0, i, j]) == bool(row_ids[0, i] == row_ids[0, j])  # row head
            assert bool(ok[1, i, j]) == bool(col_ids[0, i] == col_ids[0, j])  # column head


def test_table_relations_name_each_pair():
    # text t, header of columns 1 and 2, one data row: cells a (col 1, two tokens), b (col 2)
    segment = torch.tensor([[TEXT, HEADER, HEADER, CELL, CELL, CELL]])
    row_ids = torch.tensor([[0, 0, 0, 1, 1, 1]])
    col_ids = torch.tensor([[0, 1, 2, 1, 1, 2]])
    rel = table_relations(row_ids, col_ids, segment)[0]
    name = [[RELATIONS[int(r)] for r in row] for row in rel]
    assert name[0][1] == "sentence to header" and int(rel[0, 1]) == SENTENCE_TO_HEADER
    assert name[1][2] == "header to other header" and name[1][1] == "header to same header"
    assert name[1][3] == "header to column cell" and name[1][5] == "others"
    assert name[3][1] == "cell to column header" and name[3][2] == "others" and name[3][0] == "cell to sentence"
    assert int(rel[3, 4]) == SAME_CELL and int(rel[3, 5]) == SAME_ROW and name[0][3] == "sentence to cell"
    assert len(RELATIONS) == 13 and set(rel.unique().tolist()) <= set(range(13))
