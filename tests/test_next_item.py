"""Next-item prediction: recall@k maths, the purchase generator, and every trainer on the task."""

import json

import numpy as np
import polars as pl
import pytest
import torch
from toy_tokens import tokenized

from parsers.purchases import catalogue, generate_purchases
from seqenc.config import TVMKAConfig
from seqenc.model import TVMKA
from seqenc.sequences import collect_value_sequences
from training.bench.data import load_dataset
from training.engine.end_to_end import EndToEndTrainer
from training.engine.modes import MODES
from training.engine.trainer import InterleavedTrainer, TrainConfig
from training.tasks.baselines import count_baseline
from training.tasks.data import split_indices
from training.tasks.metrics import headline, ranking_metrics, split_metrics


def test_ranking_metrics_golden():
    scores = np.array([[0.1, 0.5, 0.4],   # target 1 ranked 1st
                       [0.6, 0.3, 0.1],   # target 2 ranked 3rd
                       [0.2, 0.2, 0.6]])  # target 0 ties with item 1: ranked 3rd (pessimistic)
    m = ranking_metrics(np.array([1, 2, 0]), scores, ks=(1, 2, 3))
    assert m == pytest.approx({"recall_at_1": 1 / 3, "recall_at_2": 1 / 3, "recall_at_3": 1.0,
                               "mrr": (1 + 1 / 3 + 1 / 3) / 3})
    # a constant model is no better than chance: every target is last
    flat = ranking_metrics(np.array([0, 1]), np.full((2, 20), 0.05))
    assert flat["recall_at_10"] == 0.0 and flat["mrr"] == pytest.approx(1 / 20)
    assert headline("next_item") == "recall_at_10"
    assert set(split_metrics(np.array([1, 2, 0]), scores, "next_item")) == {"recall_at_1", "recall_at_5",
                                                                           "recall_at_10", "mrr"}


def test_purchase_generator_is_deterministic_and_labels_come_from_the_catalogue(tmp_path):
    a = generate_purchases(tmp_path / "a.jsonl", tmp_path / "a.csv", n_users=30, n_products=60, seed=3)
    generate_purchases(tmp_path / "b.jsonl", tmp_path / "b.csv", n_users=30, n_products=60, seed=3)
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()
    events = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert len(events) == a["events"] and {e["session_id"] for e in events} == {f"u{i:06d}" for i in range(30)}
    assert {e["product"] for e in events} <= set(catalogue(60))
    labels = (tmp_path / "a.csv").read_text().splitlines()[1:]
    assert len(labels) == 30 and {row.split(",")[1] for row in labels} <= set(catalogue(60))
    with pytest.raises(ValueError, match="n_products"):
        generate_purchases(tmp_path / "c.jsonl", tmp_path / "c.csv", n_products=10)


@pytest.fixture(scope="module")
def purchases(tmp_path_factory):
    work = tmp_path_factory.mktemp("next-item")
    return load_dataset("next_item", work, work, seed=0, limit=300)


def test_next_item_dataset_goes_through_the_real_events_ingest(purchases):
    assert purchases.task == "next_item" and len(purchases.class_names) == 200
    assert set(purchases.objects["key"].unique()) >= {"product", "aisle", "department", "order_dow"}
    assert purchases.counts()["test"] == {"sequences": 60} and purchases.counts()["train"] == {"sequences": 180}
    counts = count_baseline(purchases)  # ranks by LR on product counts: the routine's products come first
    assert set(counts) >= {"recall_at_1", "recall_at_5", "recall_at_10", "mrr"} and counts["f1"] is None
    assert counts["recall_at_10"] > 0.3, counts  # chance: 10/200


def favourite_item_objects(n=200, n_items=20, seed=0):
    """Each sequence buys its favourite item 3-6 times among random other items; the next item
    is the favourite (the only value that repeats)."""
    rng = np.random.default_rng(seed)
    rows, y = [], []
    for i in range(n):
        favourite = int(rng.integers(n_items))
        items = [favourite] * int(rng.integers(3, 7)) + [int(rng.integers(n_items)) for _ in range(3)]
        for step, item in enumerate(rng.permutation(items)):
            rows += [(f"s{i}", step, "item", f"item{item}"), (f"s{i}", step, "qty", str(int(rng.integers(1, 4))))]
        y.append(favourite)
    return pl.DataFrame(rows, schema=["sequence_id", "step", "key", "value"], orient="row"), np.array(y)


@pytest.mark.parametrize("mode", ["interleaved", "record_view"])
def test_trainers_learn_next_item_retrieval(tmp_path, mode):
    """Tiny models: the TVM-KA (Algorithm 1) and an end-to-end baseline rank the next item far
    above chance (recall@1 of a random ranking: 1/20)."""
    objects, labels = favourite_item_objects()
    vs = collect_value_sequences(objects)
    tok, data, y = tokenized(vs, labels)
    torch.manual_seed(0)
    config = TVMKAConfig(vocab_size=tok.vocab_size, d_model=32, n_layers=1, n_heads=4, n_shared_heads=2, d_ff=64,
                         max_positions=32, dropout=0.0, attn_dropout=0.0, task="next_item", n_items=20)
    cfg = TrainConfig(mode=mode, pretrain_steps=60, rounds=3, tvm_steps_per_round=20, batch_tokens=2048,
                      ka_batch_size=32, lr_ka=3e-3, lr_task=3e-3, warmup_steps=5, batch_size=32, seed=0)
    splits = split_indices(np.zeros(len(y), dtype=int), 0)  # one stratum: 20 items, few of each
    if mode == "interleaved":
        trainer = InterleavedTrainer(TVMKA(config), tok, data, y, splits, cfg, tmp_path, progress=False)
    else:
        model, inputs = MODES[mode].build_model(config, data, tok, objects)
        trainer = EndToEndTrainer(model, inputs, y, splits, cfg, tmp_path, "next_item", 20, progress=False)
    result = trainer.fit()
    assert result["headline"] == "recall_at_10" and trainer.weights is None
    test = result["test"]
    assert test["recall_at_1"] <= test["recall_at_5"] <= test["recall_at_10"]
    assert test["recall_at_1"] >= 0.5, test


def test_ranking_metrics_of_ranked_lists():
    from training.tasks.metrics import ranking_metrics_of_lists

    lists = [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    m = ranking_metrics_of_lists(["a", "a", "d", "c"], lists, ks=(1, 2, 3))
    # ranks: 1, 3, beyond the list, 3
    assert m == pytest.approx({"recall_at_1": 0.25, "recall_at_2": 0.25, "recall_at_3": 0.75,
                               "mrr_at_3": (1 + 1 / 3 + 0 + 1 / 3) / 4})


def test_item_histories_count_recency_and_transitions_of_catalogue_items():
    from seqenc.sequences import item_histories

    vs = pl.DataFrame({"sequence_id": ["a", "a", "b"], "key": ["item", "qty", "qty"],
                       "values": [["P1", "P2", "P1", "X", "P2", "P1"], ["1"] * 6, ["3"]]})
    a, b, c = item_histories(vs, ["a", "b", "c"], "item", ["P0", "P1", "P2"])
    # P1 3 times, last at 6 of 6; P2 twice, last at 5 of 6 and once right after a P1 (the last
    # value); X is no catalogue item; P0 never
    assert set(a) == {1, 2}
    assert a[1] == pytest.approx((np.log(4), 1.0, 0.0)) and a[2] == pytest.approx((np.log(3), 5 / 6, np.log(2)))
    assert b == {} and c == {}  # no item key / no sequence of that id


def test_next_item_head_mixes_a_repeat_and_an_explore_distribution(tmp_path):
    from seqenc.sequences import TokenizedSequences

    config = TVMKAConfig(vocab_size=50, d_model=16, n_layers=1, n_heads=2, n_shared_heads=1, d_ff=32,
                         max_positions=16, task="next_item", n_items=5, item_history=True)
    model = TVMKA(config).eval()
    data = TokenizedSequences(["s0", "s1"], ["k", "k"], np.array([0, 1]), [[2, 7, 5, 8], [2, 7, 5, 9]],
                              np.array([0, 1]), item_history=[{3: (np.log(4), 1.0, 0.0), 1: (np.log(2), 0.5, 0.0)},
                                                              {}])
    history = data.history_features(np.array([0, 1]), 5)
    assert history.shape == (2, 5, 3) and history[0, 3].tolist() == pytest.approx([np.log(4), 1.0, 0.0])
    assert history[1].abs().sum() == 0
    reprs, mask = torch.randn(2, 1, 16), torch.ones(2, 1, dtype=torch.bool)
    head = model.ka.head
    with torch.no_grad():
        log_p = model.ka(reprs, mask, history)
        h = model.ka.encode(reprs, mask)
        explore = (head.norm(head.query(h)) @ head.items.weight.T + head.item_bias).softmax(-1)
        p_repeat = torch.sigmoid(head.repeat_gate(h))
    assert torch.allclose(log_p.exp().sum(-1), torch.ones(2), atol=1e-5)  # a distribution over the catalogue
    # s0 holds items 3 (3 times) and 1 (once): the repeat mode ranks them by count, w = (3, 0, 0)
    repeat = torch.zeros(5)
    repeat[[3, 1]] = torch.tensor([3 * np.log(4), 3 * np.log(2)]).float().softmax(-1)
    expected = p_repeat[0] * repeat + (1 - p_repeat[0]) * explore[0]
    assert torch.allclose(log_p[0].exp(), expected, atol=1e-5)
    assert torch.allclose(log_p[1].exp(), explore[1], atol=1e-5)  # nothing held: explore only
    with pytest.raises(ValueError, match="item history"):
        model.ka(reprs, mask)
    with pytest.raises(ValueError, match="no item history"):
        TokenizedSequences(["s"], ["k"], np.array([0]), [[2]], np.array([0])).history_features(np.array([0]), 5)
    assert data.subset(np.array([1, 0])).item_history == [{}, data.item_history[0]]
    model.save_pretrained(tmp_path / "m")  # the weights and the setting survive a save
    back = TVMKA.from_pretrained(tmp_path / "m").eval()
    assert back.config.item_history and torch.equal(back.ka.head.history_weight, head.history_weight)
    with pytest.raises(ValueError, match="next_item"):
        TVMKAConfig(task="binary", item_history=True)


def test_item_history_lets_the_ka_rank_a_sequences_own_items_from_few_examples(tmp_path):
    """The favourite-item task with 60 sequences (one per item, 3 each): too few for the plain
    head to learn 20 item identities, enough for the history weights."""
    objects, labels = favourite_item_objects(n=60, seed=1)
    vs = collect_value_sequences(objects)
    tok, data, y = tokenized(vs, labels)
    from seqenc.sequences import item_histories

    data.item_history = item_histories(vs, data.sequence_ids, "item", [f"item{i}" for i in range(20)])
    recall = {}
    for on in (False, True):
        torch.manual_seed(0)
        config = TVMKAConfig(vocab_size=tok.vocab_size, d_model=32, n_layers=1, n_heads=4, n_shared_heads=2,
                             d_ff=64, max_positions=32, dropout=0.0, attn_dropout=0.0, task="next_item", n_items=20,
                             item_history=on)
        cfg = TrainConfig(pretrain_steps=10, rounds=2, tvm_steps_per_round=5, tvm_ka_ratio=0.1, batch_tokens=2048,
                          ka_batch_size=16, lr_ka=3e-3, warmup_steps=2, seed=0)
        splits = split_indices(np.zeros(len(y), dtype=int), 0)
        trainer = InterleavedTrainer(TVMKA(config), tok, data, y, splits, cfg, tmp_path / str(on), progress=False)
        recall[on] = trainer.fit()["test"]["recall_at_1"]
    assert recall[True] >= 0.75 and recall[True] >= recall[False] + 0.2, recall
