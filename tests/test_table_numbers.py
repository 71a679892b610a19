"""seqenc.table_numbers: which cells are numbers, their ranks in a numeric column, their relation to
the text's numbers, and that the ids reach every token of the cell (seqenc.table_inputs)."""

from seqenc.table_inputs import NO_NUMBER, encode_table_text
from seqenc.table_numbers import BETWEEN, EQUAL, GREATER, LESS, NONE, column_ranks, numeric_features, parse_number
from seqenc.tokenizer import ValueTokenizer


def test_a_number_is_one_signed_integer_or_decimal():
    assert parse_number("1,234") == 1234 and parse_number(" -3.5 ") == -3.5 and parse_number("19th") == 19
    assert parse_number("8.3%") == 8.3
    for not_one in ("1 - 0", "38'44.105", "january 8 , 1994", "", "n/a", "12 km"):
        assert parse_number(not_one) is None, not_one


def test_ranks_are_dense_from_both_ends_in_numeric_columns_only():
    assert column_ranks(["30", "10", "20", "10", "-"]) == [(3, 1), (1, 3), (2, 2), (1, 3), (0, 0)]
    assert column_ranks(["ann", "bob", "7"]) == [(0, 0)] * 3  # a column of names with one number


def test_relation_to_the_texts_numbers():
    rows = [["a", "35,000"], ["b", "41000"], ["c", "40000"], ["d", "50000"]]
    got = [r[1][2] for r in numeric_features("less than 40,000 or 45000", rows)]
    assert got == [LESS, BETWEEN, EQUAL, GREATER]
    assert {r[1][2] for r in numeric_features("no number here", rows)} == {NONE}


def test_every_token_of_a_cell_carries_its_numbers():
    tok = ValueTokenizer.train(["total 12 7 1,234 ann bob score name"] * 2, vocab_size=100, min_frequency=1)
    e = encode_table_text(tok, "total 12", ["name", "score"], [["ann", "1,234"], ["bob", "7"]], max_len=100)
    by_cell = {}
    for r, c, n in zip(e.row_ids, e.col_ids, e.numeric_ids):
        by_cell.setdefault((r, c), set()).add(n)
    assert by_cell[(1, 2)] == {(2, 1, GREATER)} and by_cell[(2, 2)] == {(1, 2, LESS)}
    assert by_cell[(1, 1)] == by_cell[(0, 0)] == by_cell[(0, 2)] == {NO_NUMBER}
