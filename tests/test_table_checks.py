"""seqenc.table_checks: what each check of a wide table head says, and that a model on the checks
learns what word overlap cannot (superlatives, counts, comparisons over one table)."""

import json
import random

import pytest
import torch

from seqenc.config import TableConfig
from seqenc.table_checks import CHECKS, N_CHECKS, WIDE_FEATURES, check_features, text_numbers, wide_batch
from seqenc.table_inputs import N_OVERLAP

HEADER = ["player", "country", "goals", "games"]
ROWS = [["ann lee", "usa", "12", "30"],
        ["bob ray", "canada", "7", "25"],
        ["cy dent", "usa", "3", "28"]]


def checks(text: str, header=HEADER, rows=ROWS) -> dict[str, float]:
    return dict(zip(CHECKS, check_features(text, header, rows)))


def test_numbers_of_a_text():
    assert text_numbers("there be 3 team with 4.5 point and 1,200 fan") == [3.0, 4.5, 1200.0]
    assert text_numbers("two player score") == [2.0]


def test_a_superlative_is_checked_against_the_named_row_and_column():
    true, false = checks("ann lee have the highest goals"), checks("bob ray have the highest goals")
    assert (true["superlative"], true["sup_high_named"], true["sup_ok"], true["sup_bad"]) == (1, 1, 1, 0)
    assert (false["sup_ok"], false["sup_bad"]) == (0, 1)
    assert true["sup_rank"] == 1.0 and false["sup_rank"] == 0.5  # bob's 7 lies between 3 and 12
    low = checks("cy dent have the lowest goals")
    assert (low["sup_low_named"], low["sup_ok"]) == (1, 1)


def test_counts_only_and_all():
    assert checks("there be 2 player from usa")["count_named"] == 1  # two rows hold "usa"
    three = checks("there be 5 player from usa")
    assert three["count_named"] == 0 and three["count_none"] == 1  # 5 is no count and no cell
    assert checks("there be 3 player in the table")["count_rows"] == 1
    assert checks("canada be the only country of bob ray")["only_one"] == 1
    assert checks("usa be the only country")["only_not_one"] == 1  # two rows hold usa
    assert checks("every player be from usa")["all_bad"] == 1


def test_comparisons_aggregates_and_the_named_row_numbers():
    assert checks("ann lee score more goals than bob ray")["comparison_ok"] == 1
    assert checks("bob ray score more goals than ann lee")["comparison_bad"] == 1
    assert checks("ann lee score fewer goals than bob ray")["comparison_bad"] == 1
    assert checks("the total goals be 22")["aggregate_ok"] == 1  # 12 + 7 + 3
    assert checks("the total goals be 25")["aggregate_ok"] == 0
    support, conflict = checks("ann lee score 12 goals"), checks("ann lee score 9 goals")
    assert support["key_number_support"] == 1 and support["key_number_conflict"] == 0
    assert conflict["key_number_conflict"] == 1 and conflict["number_missing"] == 1
    assert checks("ann lee from usa score 7 goals")["number_elsewhere"] == 1  # bob's number, not ann's


def test_only_first_and_last_read_the_row_order():
    text = "ann lee be the first player with the most goals and there be 2 from usa"
    shuffled_rows = [ROWS[2], ROWS[0], ROWS[1]]
    columns = [2, 0, 3, 1]
    shuffled = checks(text, [HEADER[c] for c in columns], [[r[c] for c in columns] for r in shuffled_rows])
    same = checks(text)
    assert same["first_is_key"] == 1 and shuffled["first_is_key"] == 0
    assert {k: v for k, v in same.items() if k not in ("first_is_key", "last_is_key")} == \
        {k: v for k, v in shuffled.items() if k not in ("first_is_key", "last_is_key")}


def test_the_wide_inputs_have_the_registered_widths():
    example = ("ann lee have the highest goals", HEADER, ROWS)
    assert wide_batch("overlap", [example] * 2).shape == (2, N_OVERLAP)
    assert wide_batch("checks", [example]).shape == (1, WIDE_FEATURES["checks"][1])
    assert WIDE_FEATURES["checks"][1] == N_OVERLAP + 11 + N_CHECKS
    with pytest.raises(ValueError, match="table_wide_features"):
        TableConfig(table_wide_features="bag")
    assert TableConfig.from_dict({"table_wide": True}).table_wide_features == "overlap"  # a config saved before


def superlative_task(n: int, seed: int) -> list[tuple[str, list[str], list[list[str]], int]]:
    """Tables of four players; "<player> have the highest|lowest goals", true half the time. Every
    statement names one row and one column, so word overlap cannot tell true from false."""
    rng = random.Random(seed)
    names = ["ann", "bob", "cy", "dee", "eve", "fay", "gus", "hal", "ivy", "jo"]
    out = []
    for _ in range(n):
        players = rng.sample(names, 4)
        goals = rng.sample(range(1, 40), 4)
        rows = [[p, str(g)] for p, g in zip(players, goals)]
        word = rng.choice(["highest", "lowest"])
        extreme = max(goals) if word == "highest" else min(goals)
        label = rng.random() < 0.5
        player = players[goals.index(extreme)] if label else rng.choice([p for p, g in zip(players, goals) if g != extreme])
        out.append((f"{player} have the {word} goals", ["player", "goals"], rows, int(label)))
    return out


def test_a_model_of_the_checks_learns_superlatives_where_word_overlap_stays_at_chance():
    from sklearn.linear_model import LogisticRegression

    train, test = superlative_task(400, 0), superlative_task(200, 1)
    scores = {}
    for kind in WIDE_FEATURES:
        X = wide_batch(kind, [x[:3] for x in train]).numpy()
        model = LogisticRegression(max_iter=2000).fit(X, [x[3] for x in train])
        scores[kind] = model.score(wide_batch(kind, [x[:3] for x in test]).numpy(), [x[3] for x in test])
    assert scores["checks"] >= 0.95, scores
    assert scores["overlap"] <= 0.65, scores


def test_a_wide_table_encoder_reads_the_checks(tmp_path):
    """A tiny dense encoder with the wide head: its logits move with the checks alone (two
    statements whose tokens are the same bag of words, one true and one false), and it saves and
    loads with its wide width."""
    from seqenc.table_model import TableTextEncoder

    config = TableConfig(vocab_size=64, d_model=16, n_layers=1, n_heads=2, n_shared_heads=1, d_ff=32, table_attention="dense",
                         table_wide=True, n_classes=2)
    model = TableTextEncoder(config)
    assert model.wide.linear.in_features == WIDE_FEATURES["checks"][1]
    with torch.no_grad():
        model.wide.linear.weight[1, N_OVERLAP + 11 + CHECKS.index("sup_ok")] = 1.0
    features = wide_batch("checks", [("ann lee have the highest goals", HEADER, ROWS),
                                     ("bob ray have the highest goals", HEADER, ROWS)])
    wide = model.wide(features)
    assert wide[0, 1] > wide[1, 1]
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["table_wide_features"] == "checks"


def test_the_mlp_wide_head_standardises_starts_at_zero_and_learns_a_conjunction():
    """``table_wide_head = "mlp"``: zero logits at init; the running mean and variance follow the
    training batches and serve evaluation (and a training batch of one); it learns an XOR of two
    checks, which the linear head cannot."""
    from seqenc.heads import WideHead

    torch.manual_seed(0)
    head = WideHead(3, 2, "mlp")
    head.reset_parameters()
    x = torch.randint(0, 2, (256, 3)).float() * torch.tensor([1.0, 1.0, 5.0]) + torch.tensor([0.0, 0.0, 10.0])
    assert head(x).abs().max() == 0
    y = (x[:, 0] != x[:, 1]).long()
    linear = WideHead(3, 2, "linear")
    linear.reset_parameters()
    for model in (head, linear):
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        for _ in range(300):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert torch.allclose(head.running_mean, x.mean(0), atol=0.05)
    assert torch.allclose(head.running_var, x.var(0), rtol=0.05)
    head.eval()
    linear.eval()
    assert (head(x).argmax(1) == y).float().mean() == 1.0
    assert (linear(x).argmax(1) == y).float().mean() < 0.8
    head.train()
    before = head.running_mean.clone()
    head(x[:1])  # a batch of one: no batch statistics to take
    assert torch.equal(head.running_mean, before)
    assert {"running_mean", "running_var"} <= set(head.state_dict())
    assert TableConfig.from_dict({"table_wide": True}).table_wide_head == "linear"  # a config saved before
    with pytest.raises(ValueError, match="table_wide_head"):
        TableConfig(table_wide_head="tree")


def test_fitting_the_wide_head_alone_learns_the_features_and_marks_it_fitted():
    """training.engine.end_to_end.fit_wide_head: the head alone reaches what its features say
    before the encoder's first update, and its ``fitted`` flag (saved with the weights) keeps a
    resumed run from fitting it twice."""
    from seqenc.heads import WideHead
    from training.engine.end_to_end import fit_wide_head

    train, test = superlative_task(400, 0), superlative_task(200, 1)
    head = WideHead(WIDE_FEATURES["checks"][1], 2, "mlp")
    head.reset_parameters()
    assert int(head.fitted) == 0
    X, y = wide_batch("checks", [x[:3] for x in train]), torch.tensor([x[3] for x in train])
    loss = fit_wide_head(head, X, y, None, epochs=30, seed=0)
    assert int(head.fitted) == 1 and loss < 0.3
    head.eval()
    predicted = head(wide_batch("checks", [x[:3] for x in test])).argmax(1)
    assert (predicted == torch.tensor([x[3] for x in test])).float().mean() >= 0.95
