"""seqenc bench tables on a few real TabFact tables (tiny sizes): the JSON contract, TableFormer's
zero variation under row / column shuffles end to end, and the scaling rows."""

import json

import polars as pl
from shared_data import DATA, require

from training.bench.tables import overlap_features, perturb_table, table_words
from training.cli.main import main


def test_bench_tables_writes_the_contract(tmp_path):
    src = require(DATA / "tabfact")
    out = tmp_path / "tables.json"
    assert main(["bench", "tables", "--tables", str(src / "tables"), "--train", str(src / "val.jsonl"),
                 "--json", str(out), "--size", "tiny", "--max-tables", "12", "--scaling-tokens", "128",
                 "--variants", "tableformer,mafid", "--layer-positions", "256",
                 "--repeat", "1", "--threads", "1", "--jobs", "2", "--no-progress"]) == 0
    r = json.loads(out.read_text())
    assert r["jobs"]["workers"] == 2  # the two variants trained side by side, each in its own process
    # every variant trains and scores through the CLI in tests/test_table_task.py (TVM-KA too); here two + baselines
    assert set(r["accuracy"]) == {"tableformer", "mafid", "majority", "bow_lr", "overlap_lr", "row_match_lr",
                               "checks_lr", "checks_mlp"}
    for name, a in r["accuracy"].items():
        assert {"accuracy", "perturbed_accuracy", "variation"} <= set(a), name
        assert 0 <= a["accuracy"] <= 1 and 0 <= a["variation"] <= 1 and 0.5 <= a["top_prediction_share"] <= 1
    assert r["accuracy"]["tableformer"]["variation"] == 0.0  # exactly invariant, through ingest and scoring
    assert r["accuracy"]["overlap_lr"]["variation"] == 0.0  # its features ignore row and column order
    assert r["accuracy"]["row_match_lr"]["variation"] == 0.0  # so do the rows' counts
    assert r["accuracy"]["majority"]["top_prediction_share"] == 1.0
    assert r["accuracy"]["tableformer"]["accuracy"] == r["accuracy"]["tableformer"]["perturbed_accuracy"]
    rows = {(x["variant"], x["tokens"]) for x in r["scaling"]}
    tables = {(v, t) for v, t in rows if v not in ("ema_lowdim", "attention", "attention_eager")}
    assert all(t <= 128 for _, t in tables) and len(tables) == 4  # the tokens the synthetic table filled
    assert {v for v, _ in tables} == {"dense", "mate_mask", "mate", "tableformer"}
    assert rows - tables == {("ema_lowdim", 256), ("attention", 256), ("attention_eager", 256)}  # EMA vs attention
    for x in r["scaling"]:
        assert set(x) >= {"variant", "tokens", "seconds", "peak_mb", "status"} and x["status"] == "ok"
        assert x["time_vs_baseline"] > 0 and x["added_mb"] >= 0
    assert out.with_suffix(".md").is_file() and (tmp_path / "tables-accuracy.png").is_file()
    assert (tmp_path / "tables-scaling.png").is_file()

    # an interrupted bench goes on: a variant trained to the end is scored again, not retrained
    again = tmp_path / "again.json"
    assert main(["bench", "tables", "--tables", str(src / "tables"), "--train", str(src / "val.jsonl"),
                 "--json", str(again), "--size", "tiny", "--max-tables", "12", "--variants", "tableformer",
                 "--no-scaling", "--reuse-trained", "--workdir", str(tmp_path / "tables"), "--no-progress"]) == 0
    r2 = json.loads(again.read_text())
    assert r2["runs"]["tableformer"]["reused"] and not r["runs"]["tableformer"]["reused"]
    assert r2["runs"]["tableformer"]["run_id"] == r["runs"]["tableformer"]["run_id"]
    assert r2["accuracy"]["tableformer"] == r["accuracy"]["tableformer"]


def test_mafid_ablations_on_lookup_statements(tmp_path):
    """MAFiD's ablations are bench variants: each trains the MAFiD model with its one change, on the
    cell-lookup statements over real tables (training.bench.lookup, cut tables)."""
    src = require(DATA / "tabfact")
    statements, cut = tmp_path / "lookup.jsonl", tmp_path / "cut"
    assert main(["bench", "table-lookup", "--tables", str(src / "tables"), "--from", str(src / "val.jsonl"),
                 "--out", str(statements), "--tables-out", str(cut)]) == 0
    out = tmp_path / "ablations.json"
    assert main(["bench", "tables", "--tables", str(cut), "--train", str(statements), "--json", str(out),
                 "--size", "tiny", "--max-tables", "8", "--variants", "mafid_no_ema,mafid_full_ema,mafid_no_gate",
                 "--no-scaling", "--no-progress"]) == 0
    r = json.loads(out.read_text())
    assert set(r["accuracy"]) == {"mafid_no_ema", "mafid_full_ema", "mafid_no_gate", "majority", "bow_lr",
                                  "overlap_lr", "row_match_lr", "checks_lr", "checks_mlp"}
    expected = {"mafid_no_ema": ("none", True), "mafid_full_ema": ("full", True), "mafid_no_gate": ("lowdim", False)}
    for variant, (ema, gate) in expected.items():
        config = json.loads((tmp_path / "ablations" / variant / "models" / "verify" / "bundle" / "config.json").read_text())
        assert config["table_attention"] == "mafid" and (config["mafid_ema"], config["mafid_gate"]) == (ema, gate)


def test_a_table_variant_from_minilm(tmp_path):
    """``<variant>_minilm``: the same table model initialised from the offline MiniLM (its width,
    layers and WordPiece vocabulary), trained at the fine-tuning rate; here MAFiD's no-EMA ablation."""
    src = require(DATA / "tabfact")
    out = tmp_path / "minilm.json"
    assert main(["bench", "tables", "--tables", str(src / "tables"), "--train", str(src / "val.jsonl"),
                 "--json", str(out), "--size", "tiny", "--max-tables", "4", "--variants", "mafid_no_ema_minilm",
                 "--no-scaling", "--no-progress", "--config",
                 json.dumps({"train": {"task_steps": 2, "batch_size": 2}, "model": {"max_table_tokens": 96}})]) == 0
    r = json.loads(out.read_text())
    assert 0 <= r["accuracy"]["mafid_no_ema_minilm"]["accuracy"] <= 1
    run = tmp_path / "minilm" / "mafid_no_ema_minilm"
    config = json.loads((run / "models" / "verify" / "bundle" / "config.json").read_text())
    assert (config["table_attention"], config["mafid_ema"], config["d_model"], config["n_layers"]) == ("mafid", "none", 384, 6)
    trained = json.loads((run / "plots" / "verify" / "train_config.json").read_text())["train"]
    assert trained["lr_task"] == 1e-4  # the fine-tuning rate, not the scratch table encoders' 1e-3


def test_overlap_features_count_the_statement_words_a_row_and_the_table_hold():
    table = "player#country#goals\nann lee#usa#3\nbob ray#peru#5\n"
    # 7 distinct words: the row of ann lee holds ann, lee, usa; the row of bob ray holds 5; goals is a header word
    best, second, anywhere, header, length = overlap_features("ann lee of USA scored goals 5", table_words(table))
    assert (best, second, anywhere, header) == (3 / 7, 1 / 7, 5 / 7, 1 / 7)
    assert length > 0
    assert overlap_features("ann lee of usa scored goals 5", table_words(perturb_table(table, 3))) == \
        overlap_features("ann lee of usa scored goals 5", table_words(table))  # no order of rows or columns matters
    assert overlap_features("nothing here", table_words("a#b\n"))[:4] == [0.0, 0.0, 0.0, 0.0]  # a table without rows


def test_a_table_name_that_is_not_a_safe_path_is_refused(tmp_path, capsys):
    statements = tmp_path / "bad.jsonl"
    statements.write_text(json.dumps({"table": "../../etc/passwd", "statement": "x", "label": 1}) + "\n")
    assert main(["bench", "tables", "--tables", str(tmp_path), "--train", str(statements), "--json",
                 str(tmp_path / "out.json"), "--no-scaling", "--size", "tiny", "--variants", "dense",
                 "--no-progress"]) == 2
    assert "not a safe name" in capsys.readouterr().err and not (tmp_path / "out.json").exists()


def test_a_test_file_is_the_test_split_and_a_wide_variant_is_its_own_row(tmp_path):
    """``--test``: every row is scored on the test file's statements; the train file is split into
    train and dev by table only. ``<variant>_wide``: the same encoder with ``checks_lr``'s features in
    its classifier, a row beside the pure one."""
    from training.bench.lookup import synthetic_lookup

    synthetic_lookup(tmp_path / "tables", tmp_path / "all.jsonl", n_tables=60, per_table=4, seed=0)
    lines = (tmp_path / "all.jsonl").read_text().splitlines()
    train = [x for x in lines if int(json.loads(x)["table"][1:-4]) < 45]
    (tmp_path / "train.jsonl").write_text("\n".join(train) + "\n")
    (tmp_path / "test.jsonl").write_text("\n".join(x for x in lines if x not in train) + "\n")
    out = tmp_path / "given.json"
    assert main(["bench", "tables", "--tables", str(tmp_path / "tables"), "--train", str(tmp_path / "train.jsonl"),
                 "--test", str(tmp_path / "test.jsonl"), "--json", str(out), "--size", "tiny", "--variants",
                 "mate,mate_wide", "--no-scaling", "--no-progress", "--config",
                 json.dumps({"train": {"task_steps": 20, "table_wide_fit_epochs": 5}})]) == 0
    r = json.loads(out.read_text())
    assert r["split"] == {"train": r["split"]["train"], "dev": r["split"]["dev"], "test": 60} and \
        r["split"]["train"] + r["split"]["dev"] == 180 and r["split"]["dev"] > 0
    assert set(r["accuracy"]) == {"mate", "mate_wide", "majority", "bow_lr", "overlap_lr", "row_match_lr",
                               "checks_lr", "checks_mlp"}
    assert all(a["test_statements"] == 60 for a in r["accuracy"].values())
    config = json.loads((tmp_path / "given" / "mate_wide" / "models" / "verify" / "bundle" / "config.json").read_text())
    pure = json.loads((tmp_path / "given" / "mate" / "models" / "verify" / "bundle" / "config.json").read_text())
    assert config["table_wide"] is True and pure["table_wide"] is False
    assert config["table_wide_features"] == "checks" and config["table_wide_head"] == "mlp"  # as checks_mlp
    from safetensors.torch import load_file

    weights = load_file(tmp_path / "given" / "mate_wide" / "models" / "verify" / "bundle" / "model.safetensors")
    assert int(weights["wide.fitted"]) == 1  # table_wide_fit_epochs: fitted alone before the encoder's first update
    splits = pl.read_parquet(tmp_path / "given" / "mate" / "sequences" / "verify" / "splits.parquet")
    test_ids = splits.filter(pl.col("split") == "test")["sequence_id"].to_list()
    assert all(s.startswith("test.jsonl@") for s in test_ids)  # the test file's statements, and only they


def test_row_match_features_count_what_each_row_names():
    """``row_match_lr``'s features: per row, the cells of the statement named whole and the
    disjoint stretches of it they name (a value held twice, or "4" inside "4.5", is one stretch),
    and whether a row naming two has a named cell under a named header."""
    from training.bench.tables import row_match_features, table_rows

    header, rows = table_rows("team#wins#losses\nBoston#3#3\nMiami#4.5#4\nthe#a#of\n")
    assert header == ["team", "wins", "losses"]
    assert rows == [["boston", "3", "3"], ["miami", "4.5", "4"], ["the", "a", "of"]]
    f = row_match_features("the wins of Boston is 3", header, rows)
    cells_hist, cells_max, spans_hist, spans_max, header_row = f[:4], f[4], f[5:9], f[9], f[10]
    assert cells_hist == [2 / 3, 0, 0, 1 / 3] and cells_max == 3  # boston, 3, 3; function words name nothing
    assert spans_hist == [2 / 3, 0, 1 / 3, 0] and spans_max == 2  # "boston" and "3"
    assert header_row == 1.0  # "3" sits under "wins", which the text names
    f = row_match_features("the team of miami is 4.5", header, rows)
    assert (f[4], f[9], f[10]) == (3, 2, 1.0)  # cells: miami, 4.5 and the 4 inside it; stretches: miami, 4.5
    assert row_match_features("the wins of miami is 4", header, rows)[10] == 0.0  # its 4 is a loss count
