"""Novel values in unlabelled detection (seqenc.novel_values, seqenc.surprise): the values of a
key that train holds and the masked LM's sequences never do, read from the tokenised windows;
a line of the scorer above every tail score, which leaves every other sequence alone; saved in
the bundle as JSON; the unlabelled trainer on a toy whose anomalies differ only in which events
they hold."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from sklearn.metrics import roc_auc_score
from toy_tokens import split_windows

from parsers import storage
from seqenc.config import TVMKAConfig
from seqenc.model import TVMKA
from seqenc.novel_values import NovelValues, key_value_counts, value_hash
from seqenc.surprise import NOVEL_SCORE, STATS, SurpriseScorer
from training.engine.trainer import TrainConfig
from training.engine.unlabelled import UnlabelledTrainer
from training.serving.scoring import save_bundle, score_objects

MODEL = {"d_model": 32, "n_layers": 1, "n_heads": 4, "n_shared_heads": 2, "d_ff": 64, "max_positions": 64,
         "vocab_size": 512, "dropout": 0.0, "attn_dropout": 0.0}
STEPS = {"pretrain_steps": 40, "rounds": 1, "tvm_steps_per_round": 10, "batch_tokens": 2048, "warmup_steps": 5,
         "lr_tvm": 2e-3, "log_every": 10, "mlm_mask_unit": "value"}


def _objects(n: int = 200, seed: int = 0) -> tuple[pl.DataFrame, np.ndarray]:
    """Windows of 3-6 log lines, each an ``event`` and a ``level``; a normal window holds events
    of one family (E1/E2 or E3/E4), every line INFO. One window in ten (y = 1) also holds an
    ``E9`` line, as INFO as the rest: only which events it holds tells it apart."""
    rng = np.random.default_rng(seed)
    y = np.zeros(n, dtype=np.int64)
    y[rng.permutation(n)[: n // 10]] = 1
    rows = []
    for s in range(n):
        family = ["E1", "E2"] if rng.random() < 0.5 else ["E3", "E4"]
        events = list(rng.choice(family, int(rng.integers(3, 7))))
        if y[s]:
            events.insert(int(rng.integers(len(events) + 1)), "E9")
        for step, event in enumerate(events):
            for key, value in (("event", event), ("level", "INFO")):
                rows.append({"sequence_id": f"w{s:03d}", "step": step, "ts": None, "key": key, "value": value,
                             "template_id": None})
    return pl.DataFrame(rows, schema=storage.polars_schema(storage.OBJECTS_SCHEMA)), y


@pytest.fixture(scope="module")
def toy():
    objects, y_all = _objects()
    tok, data, y, splits = split_windows(objects, y_all, MODEL, n_train=120, n_dev=40)
    return {"objects": objects, "tok": tok, "data": data, "y": y, "splits": splits}


def test_values_are_read_from_the_windows(toy):
    tok, data, objects = toy["tok"], toy["data"], toy["objects"]
    counts = key_value_counts(data, "event", tok.val_sep_id)
    first = data.sequence_ids.index("w000")
    events = objects.filter((pl.col("sequence_id") == "w000") & (pl.col("key") == "event"))["value"].to_list()
    assert sum(counts[first].values()) == len(events)
    e = value_hash(tuple(tok.tokenizer.encode(events[0], add_special_tokens=False).ids))
    assert counts[first][e] == events.count(events[0])
    assert key_value_counts(data, "no-such-key", tok.val_sep_id)[first] == {}


def test_novel_values_are_held_by_train_and_never_by_the_fitted_sequences(toy):
    """Vocabulary: every train window; fitted: the normal ones. E9 is novel; a window holding it
    counts it; E1-E4 are not; with the fitted sequences = the vocabulary nothing is novel; no
    value of the key in the fitted sequences: no line; JSON round trip."""
    tok, data, y, splits = toy["tok"], toy["data"], toy["y"], toy["splits"]
    train = splits["train"]
    normal = train[y[train] == 0]
    novel = NovelValues.fit(data, normal, train, "event", tok.val_sep_id)
    e9 = value_hash(tuple(tok.tokenizer.encode("E9", add_special_tokens=False).ids))
    assert novel.values == [e9]
    n = novel.counts(data)
    np.testing.assert_array_equal(n > 0, y == 1)  # every E9 window, and only those
    assert NovelValues.fit(data, train, train, "event", tok.val_sep_id).values == []
    assert NovelValues.fit(data, normal, train, "no-such-key", tok.val_sep_id) is None
    again = NovelValues.from_dict(json.loads(json.dumps(novel.to_dict())))
    np.testing.assert_array_equal(again.counts(data), n)
    with pytest.raises(ValueError, match="retrain"):
        NovelValues.from_dict({"key": "event", "values": []})


def test_the_novel_line_lifts_only_sequences_with_novel_values(toy):
    """A scorer whose surprise ranks badly: with the novel line, every window holding a novel
    value scores above every other one; the others keep their surprise scores exactly; without
    the line (or from a bundle saved before it), the surprise alone."""
    tok, data, y, splits = toy["tok"], toy["data"], toy["y"], toy["splits"]
    train = splits["train"]
    novel = NovelValues.fit(data, train[y[train] == 0], train, "event", tok.val_sep_id)
    ref = splits["dev"][y[splits["dev"]] == 0]
    stats = np.zeros((len(data.keys), len(STATS)), dtype=np.float32)
    stats[:, STATS.index("value")] = np.random.default_rng(2).exponential(1.0, len(data.keys))  # noise
    alone = SurpriseScorer.fit(stats, data, None, ref)
    both = SurpriseScorer.fit(stats, data, None, ref, novel=novel)
    p_alone, p_both = alone.combine(None, stats, data), both.combine(None, stats, data)
    scored = np.concatenate([splits["dev"], splits["test"]])
    assert roc_auc_score(y[scored], p_alone[scored, 1]) < 0.8
    assert p_both[y == 1, 1].min() > p_both[y == 0, 1].max()
    np.testing.assert_array_equal(p_both[y == 0], p_alone[y == 0])
    line = both.novel_line(data)
    assert np.isneginf(line[y == 0]).all() and (line[y == 1] >= NOVEL_SCORE).all()
    loaded = SurpriseScorer.from_dict(json.loads(json.dumps(both.to_dict())))
    np.testing.assert_array_equal(loaded.combine(None, stats, data), p_both)
    before = {k: v for k, v in alone.to_dict().items() if k != "novel"}  # a bundle saved before the line
    assert SurpriseScorer.from_dict(before).novel is None
    with pytest.raises(ValueError, match="without a KA line"):
        SurpriseScorer.fit(stats, data, np.full((data.n_sequences, 2), 0.5), ref, novel=novel)


def test_unlabelled_trainer_reads_novel_values_and_the_bundle_scores_with_them(toy, tmp_path):
    """DeepLog's setting on the toy: the masked LM reads the normal train windows, the vocabulary
    is every train window. Every E9 window is flagged at the reference's q 0.95; the bundle
    saved as the pipeline saves it scores the same through score_objects; ``novel_key=None``
    (or every train window in the masked LM) leaves the surprise alone."""
    import torch

    tok, data, y, splits = toy["tok"], toy["data"], toy["y"], toy["splits"]
    given = {**splits, "train": splits["train"][y[splits["train"]] == 0], "vocabulary": splits["train"],
             "reference": splits["dev"][y[splits["dev"]] == 0]}
    torch.manual_seed(0)
    model = TVMKA(TVMKAConfig(**{**MODEL, "vocab_size": tok.vocab_size, "pad_token_id": tok.pad_id,
                                 "val_sep_token_id": tok.val_sep_id, "task": "binary", "n_classes": 2,
                                 "class_names": ["Normal", "Anomaly"]}))
    policy = {"policy": "quantile", "q": 0.95}
    trainer = UnlabelledTrainer(model, tok, data, np.full_like(y, -1), given, TrainConfig(**STEPS, seed=0),
                                tmp_path / "job", policy, progress=False)
    result = trainer.fit()
    assert len(trainer.novel.values) == 1 and trainer.surprise.novel is trainer.novel
    scored = np.concatenate([splits["dev"], splits["test"]])
    assert roc_auc_score(y[scored], result["probs"][scored, 1]) == 1.0
    assert (result["probs"][splits["test"], 1][y[splits["test"]] == 1] >= result["threshold"]).all()
    held = scored[y[scored] == 1]
    # NOVEL_SCORE (squashed, seqenc.surprise.squash) is above any tail score of the others
    assert result["probs"][held, 1].min() > result["probs"][np.setdiff1d(scored, held), 1].max()
    off = UnlabelledTrainer(model, tok, data, np.full_like(y, -1), given, TrainConfig(**STEPS, seed=0),
                            tmp_path / "off", policy, progress=False, novel_key=None)
    off.fit_novel()
    assert off.novel is None
    meta = {"mode": "unlabelled", "threshold": result["threshold"], "surprise": trainer.surprise.to_dict(),
            "exclude_keys": [], "event_key": False, "task_name": "anomaly"}
    directory = save_bundle(model, tok, meta, tmp_path / "bundle")
    test_ids = [data.sequence_ids[i] for i in splits["test"]]
    out = score_objects(directory, toy["objects"].filter(pl.col("sequence_id").is_in(test_ids)), progress=False)
    row = {s: i for i, s in enumerate(data.sequence_ids)}
    expected = result["probs"][[row[s] for s in out["sequence_id"]], 1]
    np.testing.assert_allclose(out["score"].to_numpy(), expected, rtol=1e-6, atol=1e-9)


CATALOG = '''
[sources.app]
kind = "events"
session_field = "window"
ts_field = "at"
label_id_column = "window"
label_column = "verdict"

[tasks.app_watch]
source = "app"
kind = "anomaly"
positive = "alert"
train_on = "normal"
size = "tiny"
config = {train = {checkpoint_every = 0}}
'''


def test_a_task_trained_on_normal_windows_flags_an_event_only_alerts_hold(tmp_path):
    """``train_on = "normal"`` through the CLI: the masked LM learns the normal train windows,
    the novel values come from every train window (the alert-only ``E9``), the bundle carries
    them, and scoring the next day gives every window holding E9 the top score."""
    from training.cli.main import main

    def write(day: str, seed: int) -> None:
        objects, y = _objects(200, seed)
        lines = [json.dumps({"window": f"{day}-{s}", "at": f"{day}T00:{int(st) % 60:02d}:00Z", "event": v})
                 for s, st, k, v in objects.select("sequence_id", "step", "key", "value").iter_rows() if k == "event"]
        (tmp_path / f"{day}.jsonl").write_text("\n".join(lines) + "\n")
        ids = sorted(objects["sequence_id"].unique().to_list())
        (tmp_path / f"{day}.csv").write_text("window,verdict\n" + "".join(
            f"{day}-{s},{'alert' if y[i] else 'ok'}\n" for i, s in enumerate(ids)))

    catalog = tmp_path / "seqenc.toml"
    catalog.write_text(CATALOG)
    work, root = tmp_path / "work", tmp_path / "work" / "data"
    for day, seed in (("2025-05-01", 0), ("2025-05-02", 1)):
        write(day, seed)
        assert main(["ingest", "events", str(tmp_path / f"{day}.jsonl"), "--root", str(root), "--source", "app",
                     "--catalog", str(catalog), "--labels", str(tmp_path / f"{day}.csv"), "--date", day]) == 0
        if day == "2025-05-01":
            assert main(["train", "--catalog", str(catalog), "--task", "app_watch", "--workdir", str(work),
                         "--no-progress"]) == 0
    bundle = work / "models" / "app_watch" / "bundle"
    novel = json.loads((bundle / "metadata.json").read_text())["surprise"]["novel"]
    assert novel["key"] == "event" and len(novel["values"]) == 1  # E9, held by alert windows only
    from parsers import storage as store

    scored = score_objects(bundle, store.read_objects(root, "app", "2025-05-02"), progress=False)
    truth = dict(pl.read_csv(tmp_path / "2025-05-02.csv").iter_rows())
    alert = np.array([truth[s] == "alert" for s in scored["sequence_id"]])
    scores = scored["score"].to_numpy()
    assert alert.sum() >= 10 and scores[alert].min() > scores[~alert].max()  # the novel line tops every tail
