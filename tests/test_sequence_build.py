"""training.tasks.sequence_build: value sequences built a bucket of sequences at a time give exactly
the files of one in-memory pass (every task kind, the time split, bins, links, repeats, item
history), and seqenc.numeric.BinFitter's bounded fit."""

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from seqenc.numeric import BinFitter, NumericBins
from training.pipeline import stages as pipeline
from training.tasks.spec import resolve_task

WATCH = """
[tasks.hdfs_watch]
source = "hdfs"
kind = "anomaly"
positive = "Anomaly"
split = "time"
exclude_keys = ["template"]
event_key = true

[tasks.hdfs_watch.config.model]
numeric_bins = 8
value_links = true
value_repeats = true
value_end = true
"""


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    base = tmp_path_factory.mktemp("build")
    catalog = base / "seqenc.toml"
    from training.tasks.catalog import DEFAULT_CATALOG as default

    catalog.write_text(default.read_text() + WATCH)
    raw = pipeline.stage_generate(str(base / "gen"), "tiny", seed=3, catalog=str(catalog))
    root = base / "data"
    for source, files in raw.items():
        pipeline.stage_ingest(str(base), source, files["path"], files["labels"], ingest_date="2025-03-01",
                              catalog=str(catalog), data_root=str(root))
    return {"base": base, "catalog": str(catalog), "root": str(root)}


def _files(folder: Path) -> dict[str, object]:
    out = {}
    for path in sorted(folder.iterdir()):
        out[path.name] = pl.read_parquet(path) if path.suffix == ".parquet" else path.read_text()
    return out


@pytest.mark.parametrize("task", ["anomaly", "milestone", "next_item", "hdfs_watch"])
def test_buckets_give_the_files_of_one_pass(data, task, monkeypatch):
    if task == "hdfs_watch":  # the vocabulary from a sample of the train sequences, the same either way
        monkeypatch.setattr("training.tasks.task_data.VOCAB_SEQUENCES", 20)
    built = {}
    for chunk in (10**9, 7):  # one bucket in memory; buckets of 7 sequences spilled to Parquet,
        # their windows tokenised 3 sequences at a time
        monkeypatch.setattr("training.tasks.sequence_build.WINDOW_SEQUENCES", 3 if chunk == 7 else 10**9)
        work = data["base"] / f"{task}-{chunk}"
        result = pipeline.stage_sequences(str(work), resolve_task(data["catalog"], task), "tiny", seed=1,
                                          data_root=data["root"], chunk_sequences=chunk, progress=False)
        built[chunk] = _files(Path(result["dir"]))
    one, many = built[10**9], built[7]
    assert one.keys() == many.keys()
    assert one["stats.json"] == many["stats.json"]
    for name, frame in one.items():
        if isinstance(frame, pl.DataFrame):
            assert frame.equals(many[name]), name
        else:
            assert frame == many[name], name
    windows = one["windows.parquet"]
    assert windows["sequence_id"].n_unique() > 3 * 7  # several buckets were built
    if task == "hdfs_watch":
        assert "numeric_bins.json" in one and "[LINKED]" in one["tokenizer.json"]
    if task == "next_item":
        assert one["item_history.parquet"].height > 0


def test_bin_fitter_is_exact_under_its_cap_and_batch_free_over_it():
    rng = np.random.default_rng(0)
    keys = [f"k{i % 3}" for i in range(400)]
    values = [[str(x) for x in rng.lognormal(3, 1, size=int(rng.integers(1, 40)))] for _ in keys]
    values[5] = ["n/a"]  # a non-number counts against the share, not in the quantiles
    exact = NumericBins.fit(keys, values, n_bins=8)
    numbers = [float(v) for k, vs in zip(keys, values) if k == "k0" for v in vs if v != "n/a"]
    assert np.allclose(exact.edges["k0"], np.unique(np.quantile(numbers, np.linspace(0, 1, 9))))

    capped = []
    for batch in (1, 7, 400):  # batches of any size keep the same thinned sample
        fitter = BinFitter(8, max_values=100)
        for i in range(0, len(keys), batch):
            fitter.add(keys[i:i + batch], values[i:i + batch])
        assert all(fitter.kept[k] <= 100 for k in fitter.kept)
        capped.append(fitter.bins())
    for other in capped[1:]:
        assert all(np.array_equal(capped[0].edges[k], other.edges[k]) for k in capped[0].edges)
    assert capped[0].edges.keys() == exact.edges.keys()
    # thinned, the edges stay close: every capped edge lies within a few ranks of the exact quantile
    ranks = np.searchsorted(np.sort(numbers), capped[0].edges["k0"]) / len(numbers)
    assert np.abs(ranks - np.linspace(0, 1, 9)[:len(ranks)]).max() < 0.1


@pytest.mark.parametrize("chunk,max_spill", [(4, 32), (4, 2), (100, 2)])
def test_sequence_chunks_hold_whole_sequences_in_id_order(tmp_path, chunk, max_spill):
    from training.tasks.buckets import sequence_chunks

    rng = np.random.default_rng(0)
    ids = [f"s{i:02d}" for i in rng.permutation(30)]
    rows = pl.DataFrame({"sequence_id": [s for s in ids for _ in range(5)], "step": [j for _ in ids for j in range(5)]})
    wanted = pl.Series(sorted(ids[:25]))  # five sequences are not asked for
    frames = list(sequence_chunks(rows.lazy(), wanted, chunk, tmp_path / "spill", max_spill=max_spill))
    assert all(f["sequence_id"].n_unique() <= chunk for f in frames)
    seen = [s for f in frames for s in sorted(f["sequence_id"].unique().to_list())]  # chunk after chunk
    got = pl.concat(frames)
    if len(frames) > 1:  # spilled: only the wanted sequences, whole, in id order, steps in order
        assert seen == wanted.to_list() and got.height == 25 * 5
        assert got.group_by("sequence_id").agg(pl.col("step").is_sorted().all())["step"].all()
        assert not list((tmp_path / "spill").rglob("*.parquet"))  # spilled files removed once read


def test_sequence_slices_cut_between_sequences_and_keep_every_row():
    from training.tasks.sequence_build import sequence_slices

    frame = pl.DataFrame({"sequence_id": ["a", "a", "b", "c", "c", "c", "d"], "key": list("xyxxyzx")})
    slices = list(sequence_slices(frame, 2))
    assert [s["sequence_id"].unique(maintain_order=True).to_list() for s in slices] == [["a", "b"], ["c", "d"]]
    assert pl.concat(slices).equals(frame)
    assert list(sequence_slices(frame, 10))[0].equals(frame)
    assert len(list(sequence_slices(frame.clear(), 2))) == 1  # an empty bucket is one empty slice


@pytest.mark.parametrize("task,world", [("anomaly", 2), ("next_item", 3), ("hdfs_watch", 2)])
def test_ranks_divide_the_build_and_write_the_files_of_one_rank(data, task, world, monkeypatch):
    """Data-parallel ranks (here threads meeting at a real barrier, in place of torch.distributed's)
    call stage_sequences together: each builds the S(k) and the windows of its own range of the
    sorted ids, in buckets of 7 sequences; rank 0 writes the task's files, and they equal one
    rank's -- splits, vocabulary, windows, item history. stats.json adds what each rank built."""
    import threading

    if task == "hdfs_watch":
        monkeypatch.setattr("training.tasks.task_data.VOCAB_SEQUENCES", 20)
    spec = resolve_task(data["catalog"], task)
    alone = pipeline.stage_sequences(str(data["base"] / f"{task}-alone"), spec, "tiny", seed=1,
                                     data_root=data["root"], chunk_sequences=7, progress=False)
    meet = threading.Barrier(world, timeout=300)
    monkeypatch.setattr("training.engine.deepspeed_engine.barrier", meet.wait)
    work, results, errors = data["base"] / f"{task}-ranks", {}, []

    def rank(r: int) -> None:
        try:
            results[r] = pipeline.stage_sequences(str(work), spec, "tiny", seed=1, data_root=data["root"],
                                                  chunk_sequences=7, progress=False, rank=r, world=world)
        except BaseException as e:  # noqa: BLE001 -- reported below
            errors.append(e)
            meet.abort()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert all(results[r] == {"rank": r} for r in range(1, world))
    one, ranked = _files(Path(alone["dir"])), _files(Path(results[0]["dir"]))
    assert one.keys() == ranked.keys()
    import json

    stats = json.loads(ranked.pop("stats.json"))
    built = stats.pop("build_ranks")
    assert stats == json.loads(one.pop("stats.json"))
    for name, frame in one.items():
        assert frame.equals(ranked[name]) if isinstance(frame, pl.DataFrame) else frame == ranked[name], name
    n = one["splits.parquet"].height
    assert [b["rank"] for b in built] == list(range(world))
    assert sum(b["sequences"] for b in built) == n and max(b["sequences"] for b in built) == -(-n // world)
    assert sum(b["windows"] for b in built) == one["windows.parquet"].height
    assert not (work / "sequences" / f".{task}.ranks").exists()  # the scratch folder is removed
