"""``seqenc bench depth``: how deep a KA trains on a pre-trained MiniLM TVM, by initialisation.

For each task the MiniLM TVM (seqenc.pretrained, frozen) computes KR(k) of every key of every
sequence once (seqenc.inference.key_representations); then, per cell (depth x init x seed), a
KA of that depth is trained on the cached KRs alone -- the KA phase of Algorithm 1 with the TVM
held still, so that only the KA's optimisation differs between cells -- and evaluated on the
task's test split. ``init``:

* ``default_warmup``: the KA's default init (BERT's, post-LayerNorm layers) with ``warmup``
  steps of linear learning-rate warm-up;
* ``default``: the same without warm-up;
* ``dt_fixup``: seqenc.fixup (LayerNorm-free Xavier layers scaled by N^-1/2 / (2 mu), mu
  measured on the training sequences), without warm-up.

Tasks (``../shared/data``): ``tabfact`` (statements joined to their tables, the table task of
``seqenc bench tables``; split by table; metric accuracy), ``bgl`` (BGL log windows,
training.bench.data; stratified split) and ``hdfs`` (HDFS blocks, training.bench.hdfs; the
``by_content`` split, seed 0: no test block's event sequence occurs in training; one key per
block, ``event``, so the KA reads a single KR and is a deep network over it); bgl and hdfs are
scored by F1 of the anomaly class at the dev-fitted threshold; ``level`` (synthetic, seeded, no
shared data: :func:`level_task`, the tiny task of the 16-layer test in tests/test_fixup_depth.py;
first 160 sequences train, 40 dev, 40 test).
Choices: the KA has no heads shared with the frozen TVM (sharing would train the
TVM's heads); the same learning rate for every cell (``lr``, large enough that warm-up matters;
chosen before any test figure was seen; each row also carries ``dev_metric`` and ``dev_loss``,
the dev split's figures, which is what a learning rate may be chosen by); ``final_train_loss``
is the mean task loss of the last 20 steps. A cell whose loss or predictions turn non-finite has
diverged: its training stops there, and its row says ``"diverged": true`` with ``metric``,
``dev_metric``, ``dev_loss`` and ``final_train_loss`` null (its curve ends at the last finite
loss). Every cell is an MLflow run (its learning curve as ``train/task_loss``), and
``<json>-curves.png`` plots the curves per task and init (logged to a summary run).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

TASKS = ("tabfact", "bgl", "hdfs")  # the default: the real small tasks
KNOWN_TASKS = (*TASKS, "level")
INITS = ("default_warmup", "default", "dt_fixup")
DEPTHS = (2, 4, 8, 16)


@dataclass
class DepthBenchSettings:
    data_dir: str
    tasks: tuple[str, ...] = TASKS
    depths: tuple[int, ...] = DEPTHS
    inits: tuple[str, ...] = INITS
    seeds: tuple[int, ...] = (0, 1, 2)
    steps: int = 300
    lr: float = 5e-4
    warmup: int = 50
    batch_size: int = 32
    tabfact_tables: int | None = None  # a seeded sample of TabFact's tables (None: all 1,696)
    bgl_lines: int | None = 200_000  # BGL log lines read
    hdfs_lines: int | None = None  # lines kept of each HDFS file (None: all 21,693 blocks)
    max_len: int = 128  # TVM window, tokens


@dataclass
class TaskKRs:
    """One task's cached KRs and what the KA trains and is scored on."""

    name: str
    metric: str  # "accuracy" | "f1"
    kr: object  # torch.Tensor [n_key_rows, d_model]
    data: object  # seqenc.sequences.TokenizedSequences
    y: np.ndarray
    splits: dict
    class_names: list
    floors: list = field(default_factory=list)  # the task's floor and count rows (floor_rows)


def floor_rows(task: str, metric: str, objects, labels: dict, split: dict, exclude, names: list) -> list[dict]:
    """The rows a KA's figure stands beside, on the task's own split: the floor -- flagging every
    sequence (``always_positive``, F1 tasks) or the train majority class (``majority``, accuracy
    tasks) -- and ``count_lr_values``, logistic regression on the counts of every key=value pair
    the sequences hold (training.tasks.baselines: the same input the KA reads, as a bag), its
    threshold fitted on dev for F1 as the cells' is."""
    import polars as pl

    from training.tasks.baselines import count_baseline, value_count_dataset
    from training.tasks.dataset import LabelledDataset
    from training.tasks.metrics import split_floors

    ids = sorted(split)
    kind = "binary" if metric == "f1" else "multiclass"
    y = np.array([names.index(labels[i]) for i in ids])
    parts = np.array([split[i] for i in ids])
    floors = split_floors(y, {p: np.flatnonzero(parts == p) for p in ("train", "dev", "test")}, kind)
    key = "f1" if metric == "f1" else "micro_f1"  # accuracy = micro F1 of one prediction a row
    base = {"task": task, "depth": None, "seed": None, "dev_loss": None, "final_train_loss": None,
            "metric_name": metric, "fixup_mu": None, "diverged": False}
    rows = [base | {"init": "always_positive" if metric == "f1" else "majority",
                    "metric": floors["test"][key], "dev_metric": floors["dev"][key]}]
    ds = LabelledDataset(task, kind, tuple(names),
                      objects.filter(pl.col("sequence_id").is_in(ids)),
                      pl.DataFrame({"sequence_id": ids, "label": [labels[i] for i in ids]}),
                      pl.DataFrame({"sequence_id": ids, "split": [split[i] for i in ids]}), "", tuple(exclude),
                      "the depth study's task")
    lr = count_baseline(value_count_dataset(ds))
    if metric == "f1":
        rows.append(base | {"init": "count_lr_values", "metric": lr["f1"], "dev_metric": lr["dev_f1"]})
    else:  # accuracy = micro F1 of the arg-max
        rows.append(base | {"init": "count_lr_values", "metric": lr["micro_f1"], "dev_metric": lr.get("dev_micro_f1")})
    return rows


def level_task(n: int = 240, seed: int = 0):
    """The synthetic task ``level``: (objects, labels {id: name}). ``n`` sequences of six steps
    with keys ``service`` and ``user`` (noise) and ``level``, whose values are ERROR / WARN in
    the ``anomaly`` sequences (about half) and INFO / DEBUG in the ``normal`` ones: one key's KR
    separates the classes, so what a cell measures is the optimisation, not the task."""
    import polars as pl

    rng = np.random.default_rng(seed)
    rows, labels = [], {}
    for i in range(n):
        sid, positive = f"s{i:04d}", bool(rng.random() < 0.5)
        for step in range(6):
            rows.append((sid, step, "service", str(rng.choice(["api", "db", "cache", "auth"]))))
            rows.append((sid, step, "user", f"u{rng.integers(1000)}"))
            rows.append((sid, step, "level", str(rng.choice(["ERROR", "WARN"] if positive else ["INFO", "DEBUG"]))))
        labels[sid] = "anomaly" if positive else "normal"
    return pl.DataFrame(rows, schema=["sequence_id", "step", "key", "value"], orient="row"), labels


def _task_objects(task: str, s: DepthBenchSettings, work: Path):
    """(objects, labels {id: name}, split {id: split}, exclude_keys, class names) of a task from
    the shared data (or generated: ``level``); class names are (negative, positive) for bgl, hdfs and level."""
    import polars as pl

    from parsers import storage
    from training.bench import tables as tb
    from training.bench.data import load_dataset
    from training.tasks.table_task import example_objects, groups_of
    from training.tasks.task_data import grouped_split

    if task == "level":
        objects, labels = level_task()
        ids = sorted(labels)  # the first 2/3 train, then 1/6 dev, 1/6 test (160 / 40 / 40)
        n = len(ids)
        split = {i: "train" if k < n * 2 // 3 else "dev" if k < n * 5 // 6 else "test" for k, i in enumerate(ids)}
        return objects, labels, split, (), ["normal", "anomaly"]
    if task == "tabfact":
        src = Path(s.data_dir) / "tabfact"
        settings = tb.TablesBenchSettings(tables=str(src / "tables"), train=str(src / "val.jsonl"),
                                          max_tables=s.tabfact_tables, seed=0)
        tb.prepare(settings, work)
        root = work / "data"
        objects = example_objects(root, tb.STATEMENTS, None, tb.TABLES, "table").collect()
        labels = storage.read_labels(root, tb.STATEMENTS)
        ids = sorted(objects["sequence_id"].unique().to_list())
        groups = groups_of(storage.scan_objects(root, tb.STATEMENTS), "table")
        split = dict(zip(ids, grouped_split(ids, groups, seed=0)))
        return objects, dict(zip(labels["sequence_id"], labels["label"])), split, (), sorted(set(labels["label"]))
    ds = load_dataset(task, s.data_dir, work, seed=0, limit=s.bgl_lines if task == "bgl" else s.hdfs_lines)
    labels = dict(zip(ds.labels["sequence_id"].to_list(), ds.labels["label"].to_list()))
    split = dict(zip(ds.split["sequence_id"].to_list(), ds.split["split"].to_list()))
    return (ds.objects.filter(pl.col("sequence_id").is_in(list(split))), labels, split, ds.exclude_keys,
            list(ds.class_names))


def task_krs(task: str, s: DepthBenchSettings, work: Path, progress: bool) -> TaskKRs:
    """A task's sequences through the frozen MiniLM TVM, once."""
    from seqenc.inference import key_representations
    from seqenc.pretrained import tvmka_from_bert
    from seqenc.sequences import collect_value_sequences, tokenize_value_sequences
    from seqenc.tokenizer import ValueTokenizer

    objects, labels, split, exclude, names = _task_objects(task, s, work / task)
    floors = floor_rows(task, "accuracy" if task == "tabfact" else "f1", objects, labels, split, exclude, names)
    tok = ValueTokenizer.from_bert("minilm")
    data = tokenize_value_sequences(collect_value_sequences(objects, exclude), tok, max_len=s.max_len)
    y = np.array([names.index(labels[i]) for i in data.sequence_ids])
    where = np.array([split[i] for i in data.sequence_ids])
    splits = {name: np.flatnonzero(where == name) for name in ("train", "dev", "test")}
    tvm = tvmka_from_bert("minilm", vocab_size=tok.vocab_size, into_ka=False, max_positions=s.max_len).tvm
    t0 = time.perf_counter()
    kr = key_representations(tvm, data, tok.pad_id, progress=progress)
    log.info("bench depth %s: %d sequences, %d keys, KRs in %.0f s", task, len(y), len(data.keys),
             time.perf_counter() - t0)
    return TaskKRs(task, "accuracy" if task == "tabfact" else "f1", kr, data, y, splits, names, floors)


def train_cell(t: TaskKRs, depth: int, init: str, seed: int, s: DepthBenchSettings,
               stop_after: int | None = None) -> tuple[dict, list[float]]:
    """One KA trained on ``t``'s cached KRs -> (row, its per-step training losses).
    ``stop_after``: only the first steps of the ``s.steps``-step schedule (the same learning
    rates, so the same early curve; tests/test_fixup_depth.py reads only that); the row then
    describes the truncated run."""
    import torch
    import torch.nn.functional as F

    from seqenc.fixup import fixup_key_aggregator, prepare_key_aggregator
    from seqenc.inference import gather_keys, ka_probabilities
    from seqenc.model import KeyAggregator, init_weights
    from seqenc.pretrained import config_from_bert
    from training.engine.engines import make_engine
    from training.tasks.data import class_weights

    torch.manual_seed(seed)
    task = "binary" if len(t.class_names) == 2 and t.metric == "f1" else "multiclass"
    config = config_from_bert("minilm", n_shared_heads=0, ka_layers=depth, n_classes=len(t.class_names), task=task,
                              ka_init="dt_fixup" if init == "dt_fixup" else "default")
    ka = KeyAggregator(config, None)
    init_weights(ka, config.init_std)
    train, offsets = t.splits["train"], t.data.key_rows_of()
    ka.fit_kr_standardisation(t.kr[torch.as_tensor(np.isin(t.data.key_seq, train))])
    if init == "dt_fixup":
        prepare_key_aggregator(ka)
        fixup_key_aggregator(ka, (gather_keys(t.kr, offsets, train[i:i + 256]) for i in range(0, len(train), 256)))
    engine = make_engine(ka, s.lr, 0.01, s.warmup if init == "default_warmup" else 0, s.steps, 1.0)
    weights = class_weights(t.y[train], len(t.class_names), task)
    rng = np.random.default_rng(seed)
    losses = []
    steps = min(s.steps, stop_after or s.steps)
    for _ in range(steps):
        ka.train()
        batch = rng.choice(train, size=min(s.batch_size, len(train)), replace=False)
        loss = F.cross_entropy(ka(*gather_keys(t.kr, offsets, batch)), torch.as_tensor(t.y[batch]), weight=weights)
        engine.backward(loss)
        engine.step()
        if not np.isfinite(loss.item()):  # diverged: the weights are lost, later steps would be NaN too
            break
        losses.append(loss.item())
    probs = ka_probabilities(ka, t.kr, t.data)
    diverged = len(losses) < steps or not np.isfinite(probs).all()
    row = {"task": t.name, "depth": depth, "init": init, "seed": seed,
           **({"metric": None, "dev_metric": None, "dev_loss": None} if diverged else cell_metrics(t, probs, task)),
           "final_train_loss": None if diverged else float(np.mean(losses[-20:])), "metric_name": t.metric,
           "fixup_mu": float(ka.fixup_mu), "diverged": diverged}
    return row, losses


def cell_metrics(t: TaskKRs, probs: np.ndarray, task: str) -> dict:
    """``metric`` on test and ``dev_metric`` on dev: accuracy, or F1 of the anomaly class at the
    threshold fitted on dev (on dev itself that F1 is optimistic and saturates at 1.0 easily);
    ``dev_loss``: the mean cross-entropy on dev (unweighted), the threshold-free figure that
    settings such as the learning rate are chosen by."""
    from training.tasks.metrics import split_metrics
    from training.tasks.thresholds import best_f1 as best_threshold  # the depth study's figures: the dev-best rule

    dev, test = t.splits["dev"], t.splits["test"]
    threshold = None if t.metric == "accuracy" else best_threshold(t.y[dev], probs[dev, 1])

    def score(part: np.ndarray) -> float:
        if threshold is None:
            return float(np.mean(probs[part].argmax(1) == t.y[part]))
        return float(split_metrics(t.y[part], probs[part], task, threshold)["f1"])

    return {"metric": score(test), "dev_metric": score(dev),
            "dev_loss": float(-np.mean(np.log(np.clip(probs[dev, t.y[dev]], 1e-12, None))))}


def bench_depth(s: DepthBenchSettings, workdir: str | Path, progress: bool = True) -> dict:
    from tqdm.auto import tqdm

    from training.serving import tracking

    work = Path(workdir).resolve()
    rows, curves = [], {}
    for task in s.tasks:
        t = task_krs(task, s, work, progress)
        rows += t.floors  # the floor and the count baseline first: what every cell stands beside
        cells = [(d, i, seed) for d in s.depths for i in s.inits for seed in s.seeds]
        for depth, init, seed in tqdm(cells, desc=f"depth study {task}", disable=not progress):
            params = {"task": task, "depth": depth, "init": init, "seed": seed, **asdict(s)}
            with tracking.run(work, f"depth-{task}-{depth}-{init}-{seed}", params, {"bench": "depth"}):
                row, losses = train_cell(t, depth, init, seed, s)
                for step in range(0, len(losses), 5):
                    tracking.log_metrics({"train/task_loss": losses[step]}, step)
                if not row["diverged"]:
                    tracking.log_metrics({f"test/{row['metric_name']}": row["metric"],
                                          f"dev/{row['metric_name']}": row["dev_metric"],
                                          "dev/loss": row["dev_loss"],
                                          "final_train_loss": row["final_train_loss"]}, len(losses))
            rows.append(row)
            curves[(task, depth, init, seed)] = losses
            log.info("bench depth: %s", row)
    return {"settings": asdict(s), "rows": rows, "curves": {"|".join(map(str, k)): v for k, v in curves.items()}}


def depth_table(r: dict) -> str:
    """Mean (min-max) of the metric and the final train loss over seeds, per task, depth and init."""
    lines = ["| task | depth | init | test metric (mean, min-max) | dev metric (mean) | dev loss (mean) "
             "| final train loss (mean) | seeds | diverged |", "|---|---:|---|---|---:|---:|---:|---:|---:|"]
    cells: dict = {}
    for x in r["rows"]:
        cells.setdefault((x["task"], x["depth"], x["init"]), []).append(x)
    for (task, depth, init), xs in cells.items():
        m = [x["metric"] for x in xs if x["metric"] is not None]  # a diverged cell has no metric
        dev = [x["dev_metric"] for x in xs if x.get("dev_metric") is not None]
        dev_loss = [x["dev_loss"] for x in xs if x.get("dev_loss") is not None]
        finals = [x["final_train_loss"] for x in xs if x["final_train_loss"] is not None]
        loss = f"{np.mean(finals):.4f}" if finals else "-"
        test = f"{np.mean(m):.3f} ({min(m):.3f}-{max(m):.3f})" if m else "-"
        lines.append(f"| {task} | {'-' if depth is None else depth} | {init} | {test} {xs[0]['metric_name']} | "
                     f"{f'{np.mean(dev):.3f}' if dev else '-'} | {f'{np.mean(dev_loss):.4f}' if dev_loss else '-'} | "
                     f"{loss} | {len(xs)} | "
                     f"{sum(bool(x.get('diverged')) for x in xs)} |")
    return "\n".join(lines)


def plot_depth(r: dict, path: Path) -> list[Path]:
    """``<path>-curves.png``: training loss curves, a panel per task and init, a colour per depth."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted({x["task"] for x in r["rows"]})
    inits = [i for i in INITS if any(x["init"] == i for x in r["rows"])]
    fig, axes = plt.subplots(len(tasks), len(inits), figsize=(4 * len(inits), 3 * len(tasks)), squeeze=False)
    for (task, depth, init, seed), losses in ((k.split("|"), v) for k, v in r["curves"].items()):
        ax = axes[tasks.index(task)][inits.index(init)]
        ax.plot(losses, lw=0.8, color=plt.cm.viridis(DEPTHS.index(int(depth)) / len(DEPTHS))
                if int(depth) in DEPTHS else "grey", label=f"depth {depth}" if seed == "0" else None)
        ax.set_title(f"{task}: {init}")
        ax.set_xlabel("KA step")
        ax.set_ylabel("train loss")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    out = path.with_name(path.stem + "-curves.png")
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return [out]


def log_summary(r: dict, workdir: Path, files: list[Path]) -> None:
    """The table and plots as artifacts of one summary MLflow run."""
    import mlflow

    from training.serving import tracking

    with tracking.run(workdir, "depth-summary", {"settings": json.dumps(r["settings"])[:450]}, {"bench": "depth"}):
        for f in files:
            mlflow.log_artifact(str(f), "bench_depth")
