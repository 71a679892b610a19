"""Every user error of the CLI prints one line -- what is wrong and what to do -- exits non-zero
and shows no traceback (``-v`` shows it). One test per case of the issue: a missing file, an
unknown task or source, a catalogue error, labels whose ids match no sequence, one class only,
no sequences in a date range, an unreadable model URI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from byod_data import write_byod
from cli_error import cli_error

from training.cli.main import main


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    base = tmp_path_factory.mktemp("cli-errors")
    made = write_byod(base, n_orders=40, n_sessions=10)
    orders, catalog = made["orders"], made["catalog"]
    root = base / "work" / "data"
    assert main(["ingest", "events", str(orders["events"]), "--root", str(root), "--source", "orders",
                 "--catalog", str(catalog), "--date", "2025-03-01", "--labels", str(orders["stage"])]) == 0
    return {"base": base, "catalog": str(catalog), "root": str(root), "work": str(base / "work"), "orders": orders}



def test_missing_input_file(setup):
    msg = cli_error(["ingest", "events", str(setup["base"] / "nope.jsonl"), "--root", setup["root"], "--source", "x"])
    assert msg.startswith("seqenc ingest:") and "nope.jsonl" in msg


def test_missing_catalogue_file(setup):
    msg = cli_error(["tasks", "--catalog", str(setup["base"] / "missing.toml")])
    assert "does not exist" in msg and "--catalog" in msg


def test_unknown_task(setup):
    msg = cli_error(["train", "--catalog", setup["catalog"], "--task", "nosuch", "--workdir", setup["work"]])
    assert "unknown task 'nosuch'" in msg and "order_stage" in msg  # lists the declared ones


def test_unknown_source_profile(setup):
    msg = cli_error(["profile", "--root", setup["root"], "--source", "nosuch"])
    assert "no ingested objects" in msg and "seqenc ingest" in msg


def test_catalogue_error(setup, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[sources.s]\nkind = "events"\n[tasks.t]\nsource = "s"\nkind = "clasify"\n')
    msg = cli_error(["tasks", "--catalog", str(bad)])
    assert str(bad.resolve()) in msg and "[tasks.t] kind" in msg and "'multiclass'" in msg


def test_labels_that_match_no_sequence(setup, tmp_path):
    labels = tmp_path / "labels.csv"
    labels.write_text("order_ref,stage\nzz-1,kumquat\nzz-2,yak\n")
    root = str(setup["base"] / "nomatch" / "data")
    assert main(["ingest", "events", str(setup["orders"]["events"]), "--root", root, "--source", "orders",
                 "--catalog", setup["catalog"], "--labels", str(labels)]) == 0
    msg = cli_error(["train", "--catalog", setup["catalog"], "--task", "order_stage",
                  "--workdir", str(setup["base"] / "nomatch")])
    assert "match no ingested sequence" in msg and "label_id_column" in msg


def test_labels_with_a_missing_column(setup, tmp_path):
    labels = tmp_path / "labels.csv"
    labels.write_text("id,stage\nord-0-0000,yak\n")
    msg = cli_error(["ingest", "events", str(setup["orders"]["events"]), "--root", setup["root"], "--source", "orders",
                  "--catalog", setup["catalog"], "--date", "2025-03-01", "--labels", str(labels)])
    assert "no column 'order_ref'" in msg and "id, stage" in msg


def test_one_class_only(setup, tmp_path):
    labels = tmp_path / "one.csv"
    labels.write_text("order_ref,risk\n" + "".join(f"ord-0-{i:04d},legit\n" for i in range(40)))
    root = str(setup["base"] / "one" / "data")
    assert main(["ingest", "events", str(setup["orders"]["events"]), "--root", root, "--source", "orders_risk",
                 "--catalog", setup["catalog"], "--labels", str(labels)]) == 0
    msg = cli_error(["train", "--catalog", setup["catalog"], "--task", "fraud_watch",
                  "--workdir", str(setup["base"] / "one")])
    assert "exactly two classes" in msg and "one class alone" in msg


def test_no_sequences_in_a_date_range(setup):
    msg = cli_error(["evaluate", "--workdir", setup["work"], "--task", "order_stage", "--catalog", setup["catalog"],
                  "--date", "1999-01-01"])
    assert msg == ("seqenc evaluate: no labelled sequence of source 'orders' in ingest dates 1999-01-01; nothing to "
                   "evaluate (seqenc tasks --root ... lists what is ingested) (add -v before the command for the "
                   "traceback)")


def test_unreadable_model_uri(setup):
    msg = cli_error(["score", "--model", "models:/no-such-model/3", "--input", setup["root"], "--out",
                  str(setup["base"] / "pred"), "--tracking-dir", setup["work"]])
    assert "models:/no-such-model/3" in msg and "cannot be read" in msg


def test_the_process_prints_one_line_and_verbose_shows_the_traceback(setup):
    argv = [sys.executable, "-m", "training.cli.main", "tasks", "--catalog", str(setup["base"] / "missing.toml")]
    quiet = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert quiet.returncode != 0 and "Traceback" not in quiet.stderr
    assert len([ln for ln in quiet.stderr.splitlines() if ln.strip()]) == 1
    loud = subprocess.run(argv[:3] + ["-v"] + argv[3:], capture_output=True, text=True, timeout=120)
    assert loud.returncode != 0 and "Traceback" in loud.stderr


def test_an_unknown_seqenc_size_is_named(setup, tmp_path, monkeypatch):
    unsized = tmp_path / "unsized.toml"  # tasks that declare no size: the environment's applies
    unsized.write_text(Path(setup["catalog"]).read_text().replace('size = "tiny"', ""))
    monkeypatch.setenv("SEQENC_SIZE", "huge")
    msg = cli_error(["train", "--catalog", str(unsized), "--task", "order_stage", "--workdir", setup["work"]])
    assert "SEQENC_SIZE 'huge'" in msg and "tiny" in msg


def test_the_demo_reads_seqenc_size_too(tmp_path, monkeypatch):
    # like every command without --size: the environment's size, checked before anything is written
    monkeypatch.setenv("SEQENC_SIZE", "huge")
    msg = cli_error(["demo", "--out", str(tmp_path / "out")])
    assert "SEQENC_SIZE 'huge'" in msg and not (tmp_path / "out").exists()


def test_size_precedence_flag_then_task_then_environment(monkeypatch):
    from training.pipeline.stages import resolve_size

    monkeypatch.delenv("SEQENC_SIZE", raising=False)
    assert resolve_size(None, None) == "demo"
    monkeypatch.setenv("SEQENC_SIZE", "tiny")
    assert resolve_size(None, None) == "tiny"
    assert resolve_size(None, "demo") == "demo"  # a declared size wins over the environment
    assert resolve_size("demo", "tiny") == "demo"  # and the flag over both
