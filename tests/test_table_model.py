"""seqenc.table_model: TableFormer is exactly invariant to row and column order, MATE's two
implementations agree inside the model, and every variant builds its inputs in one place."""

import random

import pytest
import torch

from seqenc.config import TableConfig
from seqenc.structure import CELL, HEADER, TEXT
from seqenc.table_inputs import encode_table_text
from seqenc.table_model import TableExamples, TableTextEncoder
from seqenc.tokenizer import ValueTokenizer

WORDS = [f"w{i}" for i in range(60)] + [str(i) for i in range(30)]


@pytest.fixture(scope="module")
def tok():
    return ValueTokenizer.train(WORDS * 2, vocab_size=200, min_frequency=1)


def random_table(rng: random.Random, n_rows: int = 5, n_cols: int = 4):
    text = " ".join(rng.choices(WORDS, k=rng.randint(3, 8)))
    header = [f"h{c} {rng.choice(WORDS)}" for c in range(n_cols)]
    rows = [[" ".join(rng.choices(WORDS, k=rng.randint(1, 3))) for _ in range(n_cols)] for _ in range(n_rows)]
    return text, header, rows


def shuffled(table, rng: random.Random):
    text, header, rows = table
    cols, order = list(range(len(header))), list(range(len(rows)))
    rng.shuffle(cols)
    rng.shuffle(order)
    return text, [header[c] for c in cols], [[rows[r][c] for c in cols] for r in order]


def model(kind: str, tok, **extra) -> TableTextEncoder:
    torch.manual_seed(0)
    config = TableConfig(vocab_size=tok.vocab_size, d_model=32, n_layers=2, n_heads=4, n_shared_heads=0, d_ff=64,
                         dropout=0.0, attn_dropout=0.0, max_positions=80, table_attention=kind, n_classes=2,
                         **extra)
    m = TableTextEncoder(config).eval()
    if m.relation_bias is not None:  # zero scalars would make the test trivial: give them values
        for bias in m.relation_bias:
            torch.nn.init.normal_(bias.scalars.weight, std=1.0)
    return m


def test_inputs_carry_the_structure(tok):
    e = encode_table_text(tok, "w1 w2", ["h0", "h1"], [["w3", "w4 w5"], ["1", "2"]], max_len=100)
    assert e.segment[:4] == [TEXT] * 4 and e.input_ids[0] == tok.cls_id and e.input_ids[3] == tok.sep_id
    table = list(zip(e.segment[4:], e.row_ids[4:], e.col_ids[4:]))
    assert table[:2] == [(HEADER, 0, 1), (HEADER, 0, 2)] and table[2] == (CELL, 1, 1)
    assert e.position_ids[4:] == [0, 0, 0, 0, 1, 0, 0]  # per cell: "w4 w5" counts 0, 1
    cut = encode_table_text(tok, "w1 w2", ["h0", "h1"], [["w3", "w4 w5"], ["1", "2"]], max_len=9)
    assert cut.rows_dropped == 1 and len(cut) == 9


def test_exact_match_features_mark_what_the_text_names(tok):
    """match_ids (seqenc.table_inputs): a cell the text names whole (its tokens a run of the
    text's, in order) is CELL_MATCH on every token, a cell sharing a word is WORD_MATCH on that
    word only; the text's run naming a cell is CELL_MATCH, its other words found in the table
    WORD_MATCH; [CLS], [SEP], punctuation and function words never match on their own."""
    from seqenc.table_inputs import CELL_MATCH, NO_MATCH, WORD_MATCH

    tok = ValueTokenizer.train([*WORDS, "the of is , h0 h1"] * 2, vocab_size=200, min_frequency=1)
    e = encode_table_text(tok, "the h1 of w3 is w4 , w5", ["h0", "h1"], [["w3", "w4 , w5"], ["w6", "w4 w7"]],
                          max_len=100)
    by_token = [(tok.decode([i]).strip(), s, r, m) for i, s, r, m in zip(e.input_ids, e.segment, e.row_ids,
                                                                          e.match_ids)]
    cells = {(t, r): m for t, s, r, m in by_token if s == CELL}
    assert cells[("w3", 1)] == cells[("w4", 1)] == cells[(",", 1)] == cells[("w5", 1)] == CELL_MATCH
    assert (cells[("w6", 2)], cells[("w4", 2)], cells[("w7", 2)]) == (NO_MATCH, WORD_MATCH, NO_MATCH)
    headers = {t: m for t, s, _, m in by_token if s == HEADER}
    assert headers == {"h0": NO_MATCH, "h1": CELL_MATCH}
    text = [(t, m) for t, s, _, m in by_token if s == TEXT]
    assert text[0] == ("[CLS]", NO_MATCH) and text[-1] == ("[SEP]", NO_MATCH)
    assert dict(text[1:-1]) == {"the": NO_MATCH, "h1": CELL_MATCH, "of": NO_MATCH, "w3": CELL_MATCH, "is": NO_MATCH,
                                "w4": CELL_MATCH, ",": CELL_MATCH, "w5": CELL_MATCH}  # the run naming the cell
    # whole means in order: "w5 , w4" names the cell "w4 , w5" word by word only
    swapped = encode_table_text(tok, "w5 , w4", ["h0"], [["w4 , w5"]], max_len=100)
    assert [m for m, s in zip(swapped.match_ids, swapped.segment) if s == CELL] == [WORD_MATCH, NO_MATCH, WORD_MATCH]
    # the same features reach MAFiD's row blocks, token for token
    from seqenc.mafid import row_blocks

    config = TableConfig(vocab_size=tok.vocab_size, max_positions=80, table_row_match=False,
                         table_header_match=False)  # plain ids here
    ids, _, match, _ = row_blocks(tok, "the h1 of w3 is w4 , w5", ["h0", "h1"], [["w3", "w4 , w5"]], config)[0]
    assert [m for i, m in zip(ids, match) if tok.decode([i]).strip() == "w5"] == [CELL_MATCH, CELL_MATCH]


def test_row_match_ids_count_the_cells_a_row_has_named(tok):
    """With row_match, a cell token's id is its match id + MATCH_TYPES x (how many cells of its
    row the text names whole, 3 and more in one bucket); the text's and the header's ids do not
    change, and without row_match nothing does. A true lookup names two cells of one row, its
    swapped (false) twin one cell in each of two rows: the ids tell the two apart."""
    from seqenc.mafid import row_blocks
    from seqenc.table_inputs import CELL_MATCH, MATCH_TYPES, NO_MATCH, WORD_MATCH, match_vocabulary

    header, rows = ["h0", "h1", "h2"], [["w1", "w2", "w3"], ["w4", "w5", "w6"], ["w7", "w8 w9", "w8"]]

    def cells(text, row_match=True):
        e = encode_table_text(tok, text, header, rows, max_len=100, row_match=row_match)
        return e, [(r, m) for s, r, m in zip(e.segment, e.row_ids, e.match_ids) if s == CELL]

    true, got = cells("w1 w2")
    assert got[:3] == [(1, CELL_MATCH + 2 * MATCH_TYPES)] * 2 + [(1, NO_MATCH + 2 * MATCH_TYPES)]
    assert {m for r, m in got if r > 1} == {NO_MATCH}  # rows naming no cell: bucket 0
    false, got = cells("w1 w5")
    assert [m for r, m in got if r <= 2] == [CELL_MATCH + MATCH_TYPES, NO_MATCH + MATCH_TYPES, NO_MATCH + MATCH_TYPES,
                                             NO_MATCH + MATCH_TYPES, CELL_MATCH + MATCH_TYPES, NO_MATCH + MATCH_TYPES]
    _, got = cells("w7 w8 w9 w8")  # three cells named: the last bucket; "w8 w9" is also a word match of "w8"'s row
    assert {m for r, m in got if r == 3} == {CELL_MATCH + 3 * MATCH_TYPES}
    _, got = cells("w8 w1")  # "w8" names the cell "w8" whole and shares a word with "w8 w9"
    assert [m for r, m in got if r == 3] == [NO_MATCH + MATCH_TYPES, WORD_MATCH + MATCH_TYPES, NO_MATCH + MATCH_TYPES,
                                             CELL_MATCH + MATCH_TYPES]
    plain, _ = cells("w1 w2", row_match=False)
    assert max(plain.match_ids) < MATCH_TYPES <= max(true.match_ids) < match_vocabulary(True)
    text_and_header = [m for m, s in zip(plain.match_ids, plain.segment) if s != CELL]
    assert text_and_header == [m for m, s in zip(true.match_ids, true.segment) if s != CELL]
    # MAFiD's row blocks carry the same ids
    config = TableConfig(vocab_size=tok.vocab_size, max_positions=80, table_row_match=True)
    _, _, match, _ = row_blocks(tok, "w1 w2", header, rows, config)[0]
    assert CELL_MATCH + 2 * MATCH_TYPES in match


def test_row_match_spans_count_what_the_text_names_once(tok):
    """row_count "spans": a row's bucket counts the disjoint stretches of the text its cells name,
    so a row holding the text's one value twice, or a cell named inside another named cell's
    stretch, names one thing -- where "cells" counts two. A row naming two things stays at two."""
    from seqenc.table_inputs import MATCH_TYPES

    header = ["h0", "h1", "h2"]
    rows = [["w1", "w2", "w2"], ["w4", "w5 w6", "w6"], ["w7", "w8", "w9"]]

    def buckets(text, row_count):
        e = encode_table_text(tok, text, header, rows, max_len=100, row_match=True, row_count=row_count)
        return [max(m for s, r, m in zip(e.segment, e.row_ids, e.match_ids) if s == CELL and r == row) // MATCH_TYPES
                for row in (1, 2, 3)]

    # "w2" twice in row 1; "w6" inside "w5 w6" in row 2; "w7" and "w9" two things of row 3
    text = "w2 of w5 w6 is w7 w9"
    assert buckets(text, "cells") == [2, 2, 2]
    assert buckets(text, "spans") == [1, 1, 2]
    assert buckets("w1 is w2", "spans") == [2, 0, 0]  # a true lookup's row: two things named
    with pytest.raises(ValueError, match="row_count"):
        encode_table_text(tok, text, header, rows, max_len=100, row_match=True, row_count="words")
    with pytest.raises(ValueError, match="table_row_count"):
        TableConfig(table_row_count="words")


def test_header_match_ids_mark_the_cells_under_a_named_header(tok):
    """header_match: a cell's id moves up by the vocabulary without it when the text names its
    column's header whole; the text's and the header's ids and the other cells' do not change."""
    from seqenc.mafid import row_blocks
    from seqenc.table_inputs import CELL_MATCH, MATCH_TYPES, match_vocabulary

    header, rows = ["w11", "w12", "w13"], [["w1", "w2", "w3"], ["w4", "w5", "w6"]]
    plain = encode_table_text(tok, "the w12 of w1 is w2", header, rows, max_len=100, row_match=True)
    marked = encode_table_text(tok, "the w12 of w1 is w2", header, rows, max_len=100, row_match=True,
                               header_match=True)
    offset = match_vocabulary(True)
    for s, c, a, b in zip(plain.segment, plain.col_ids, plain.match_ids, marked.match_ids):
        assert b == (a + offset if s == CELL and c == 2 else a)
    assert CELL_MATCH + 2 * MATCH_TYPES + offset in marked.match_ids  # w2: named, its row names two, under w12
    assert max(marked.match_ids) < match_vocabulary(True, True) == 2 * offset
    config = TableConfig(vocab_size=tok.vocab_size, max_positions=80)  # the default: on, and MAFiD's blocks too
    assert config.table_header_match
    _, _, match, _ = row_blocks(tok, "the w12 of w1 is w2", header, rows, config)[0]
    assert CELL_MATCH + 2 * MATCH_TYPES + offset in match


def test_configs_saved_before_a_field_load_as_they_were_trained():
    """A saved config without table_match / tableformer_bias_scale / table_attention (a model
    trained before they existed or changed default) loads with the values it was trained with, so
    its weights still fit."""
    gone = ("table_match", "tableformer_bias_scale", "table_attention", "table_row_match", "table_row_count",
            "table_header_match")
    old = {k: v for k, v in TableConfig().to_dict().items() if k not in gone}
    loaded = TableConfig.from_dict(old)
    assert loaded.table_match is False and loaded.tableformer_bias_scale == 1.0 and loaded.table_attention == "dense"
    assert loaded.table_row_match is False and loaded.table_row_count == "cells" and not loaded.table_header_match
    assert (TableConfig().table_match, TableConfig().table_attention) == (True, "mate")
    assert TableConfig().table_row_match is True and TableConfig().table_row_count == "spans"
    assert TableConfig.from_dict(TableConfig().to_dict()) == TableConfig()


def test_table_fields_live_in_the_table_config_alone():
    """The table encoders have their own config class (as each model family in transformers): a
    TVM-KA config holds none of its fields, refuses them, and a config saved before the split
    (every field in one file) loads into either class; a table encoder refuses a TVMKAConfig."""
    from seqenc.config import TABLE_FIELDS, TVMKAConfig
    from seqenc.table_model import table_encoder

    assert not TABLE_FIELDS & set(TVMKAConfig().to_dict()) and len(TABLE_FIELDS) >= 15
    with pytest.raises(TypeError):
        TVMKAConfig(table_attention="mate")
    saved_before = TableConfig().to_dict()  # what every config.json held before the split
    assert TVMKAConfig.from_dict(saved_before) == TVMKAConfig()
    assert TableConfig.from_dict(saved_before) == TableConfig()
    with pytest.raises(TypeError, match="takes a TableConfig"):
        table_encoder(TVMKAConfig())


def test_tableformer_scalars_move_at_their_scale(tok):
    from seqenc.structure import TableFormerBias

    bias = TableFormerBias(4, scale=30.0)
    with torch.no_grad():
        bias.scalars.weight.fill_(0.1)
    assert torch.allclose(bias.weight, torch.full((13, 4), 3.0))
    relations = torch.zeros(1, 2, 2, dtype=torch.long)
    assert torch.allclose(bias(relations, torch.ones(1, 2, dtype=torch.bool)), torch.full((1, 4, 2, 2), 3.0))


@pytest.mark.parametrize("seed", range(3))
def test_tableformer_is_exactly_invariant_to_row_and_column_order(tok, seed):
    rng = random.Random(seed)
    tables = [random_table(rng, rng.randint(2, 6), rng.randint(2, 5)) for _ in range(4)]
    perturbed = [shuffled(t, rng) for t in tables]
    ids = [f"e{i}" for i in range(4)]
    outputs = {}
    for kind in ("tableformer", "dense"):
        m = model(kind, tok)
        with torch.no_grad():
            a = m(*m.batch_inputs(TableExamples(ids, tables), range(4), tok))
            b = m(*m.batch_inputs(TableExamples(ids, perturbed), range(4), tok))
        outputs[kind] = (a - b).abs().max().item(), bool((a.argmax(-1) == b.argmax(-1)).all())
    assert outputs["tableformer"][0] <= 1e-5 and outputs["tableformer"][1]
    assert outputs["dense"][0] > 1e-4  # row / column ids see the order: the test can tell


def test_mate_efficient_and_masked_agree_inside_the_model(tok):
    rng = random.Random(5)
    tables = [random_table(rng, 6, 4) for _ in range(3)]
    data = TableExamples(["a", "b", "c"], tables)
    masked, fast = model("mate_mask", tok), model("mate", tok, mate_global=12, mate_radius=40)
    fast.load_state_dict(masked.state_dict())  # the same parameters: MATE adds none
    with torch.no_grad():
        x = masked.batch_inputs(data, range(3), tok)
        assert (masked.encode(*x) - fast.encode(*x)).abs().max() <= 1e-5
        dense = model("dense", tok)
        dense.load_state_dict(masked.state_dict())
        assert (dense.encode(*x) - masked.encode(*x)).abs().max() > 1e-4  # the heads do restrict


def test_examples_come_from_long_form_objects(tok):
    import polars as pl

    objects = pl.DataFrame({"sequence_id": ["s"] * 5, "step": [-1, 0, 0, 1, 1],
                            "key": ["statement", "name", "score", "name", "score"],
                            "value": ["ann won", "ann", "3", "bob", "5"]})
    data = TableExamples.from_objects(objects)
    assert data.tables == [("ann won", ["name", "score"], [["ann", "3"], ["bob", "5"]])]
    with pytest.raises(ValueError, match="no objects"):
        TableExamples.from_objects(objects, ["s", "t"])


@pytest.mark.parametrize("kind", ["dense", "mafid"])
def test_table_encoders_start_from_minilm(kind):
    from transformers import BertModel

    from seqenc.pretrained import config_from_bert, load_bert_table_encoder, minilm_dir
    from seqenc.table_model import table_encoder

    config = config_from_bert("minilm", TableConfig, dropout=0.0, attn_dropout=0.0, max_positions=80, table_attention=kind,
                              n_classes=2, n_shared_heads=0)
    model = table_encoder(config).eval()
    load_bert_table_encoder(model, "minilm")
    bert = BertModel.from_pretrained(str(minilm_dir())).eval()
    layers = model.encoder.layers if kind == "mafid" else model.layers
    assert torch.equal(layers[5].ffn_out.weight, bert.encoder.layer[5].output.dense.weight)
    assert torch.equal(model.embeddings.word.weight[:1000], bert.embeddings.word_embeddings.weight[:1000])
    if kind == "dense":  # with zero row / column / match embeddings the encoder is BERT on per-cell positions
        with torch.no_grad():
            model.embeddings.row.weight.zero_()
            model.embeddings.column.weight.zero_()
            model.embeddings.match.weight.zero_()
            for emb in model.embeddings.numeric.children():
                emb.weight.zero_()
        ids = torch.tensor([[101, 2003, 1037, 102, 3231, 2054, 2003, 1037]])
        types = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1]])
        pos = torch.tensor([[0, 1, 2, 3, 0, 1, 0, 0]])
        zeros, mask = torch.zeros_like(ids), torch.ones_like(ids, dtype=torch.bool)
        with torch.no_grad():
            ours = model.encode(ids, types, types * 2, zeros, zeros, pos, zeros, torch.zeros(1, 8, 3, dtype=torch.long), mask)
            # an explicit all-ones mask: without one, transformers 5 reads positions that restart
            # at 0 as packed sequences and attends within each restart only (per-cell positions
            # would split the input into cells); ours attends over the whole input
            theirs = bert(input_ids=ids, token_type_ids=types, position_ids=pos,
                          attention_mask=torch.ones_like(ids)).last_hidden_state[:, 0]
        assert (ours - theirs).abs().max() < 1e-4


def test_tableformer_block_by_block_equals_the_whole_bias_with_gradients(tok):
    rng = random.Random(3)
    data = TableExamples(["a", "b"], [random_table(rng, n_rows=7), random_table(rng, n_rows=3)])
    outs, grads = {}, {}
    for block in (0, 16):
        m = model("tableformer", tok, tableformer_block=block)
        batch = m.batch_inputs(data, [0, 1], tok)
        assert batch[0].shape[1] > 16  # several blocks, and padding in the second example
        out = m(*batch)
        out.sum().backward()
        outs[block] = out.detach()
        grads[block] = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    assert (outs[0] - outs[16]).abs().max() <= 1e-5
    assert grads[0].keys() == grads[16].keys() and any("relation_bias" in n for n in grads[16])
    for name in grads[0]:
        assert torch.allclose(grads[0][name], grads[16][name], atol=1e-5), name


@pytest.mark.parametrize("kind", ["dense", "mate", "tableformer"])
def test_dt_fixup_new_layers_on_a_table_encoder(tok, kind):
    """DT-Fixup on a table encoder (seqenc.fixup): the new layers have no LayerNorm and Xavier
    weights; mu is the largest norm of the pre-trained layers' output over the real positions of
    the training examples; v, w and the MLP of each new layer are scaled by N^-1/2 / (2 mu), once,
    and nothing else changes."""
    from torch import nn

    from seqenc.fixup import dt_fixup_factor, fixup_table_encoder

    m = model(kind, tok, table_new_layers=3, table_init="dt_fixup")
    assert len(m.layers) == 2 and len(m.new_layers) == 3
    assert all(isinstance(layer.attn_norm, nn.Identity) and isinstance(layer.ffn_norm, nn.Identity)
               for layer in m.new_layers)
    assert all(isinstance(layer.attn_norm, nn.LayerNorm) for layer in m.layers)
    w = m.new_layers[1].ffn_in.weight  # Xavier uniform: bound sqrt(6 / (fan_in + fan_out))
    assert w.abs().max() <= (6 / (32 + 64)) ** 0.5 and w.std() > 0.5 * (2 / (32 + 64)) ** 0.5
    rng = random.Random(3)
    data = TableExamples([f"e{i}" for i in range(6)], [random_table(rng, n_rows=rng.randint(1, 6)) for _ in range(6)])
    batches = [m.batch_inputs(data, [0, 1, 2], tok), m.batch_inputs(data, [3, 4, 5], tok)]
    with torch.no_grad():
        expected = max(float(m.hidden(*b, new_layers=False).norm(dim=-1)[b[-1]].max()) for b in batches)
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    mu = fixup_table_encoder(m, iter(batches))
    assert mu == pytest.approx(expected, rel=1e-5) and float(m.fixup_mu) == pytest.approx(mu)
    factor = dt_fixup_factor(mu, 3)
    scaled = (".attn.value.weight", ".attn.output.weight", ".ffn_in.weight", ".ffn_out.weight")
    for name, p in m.named_parameters():
        if name.startswith("new_layers.") and name.endswith(scaled):
            assert torch.allclose(p, before[name] * factor), name
        else:  # the (pre-trained) layers, embeddings, relation scalars and head stay as they were
            assert torch.equal(p, before[name]), name
    fixup_table_encoder(m, iter(batches))  # applied already (a resumed run): nothing changes
    assert torch.allclose(m.new_layers[0].ffn_out.weight, before["new_layers.0.ffn_out.weight"] * factor)
    assert m(*batches[0]).shape == (3, 2)
    with pytest.raises(ValueError, match="table_new_layers"):
        TableConfig(table_init="dt_fixup")
    with pytest.raises(ValueError, match="table_new_layers"):
        TableConfig(table_attention="mafid", table_new_layers=2)
