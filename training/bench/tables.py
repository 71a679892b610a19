"""``seqenc bench tables``: table-text verification (TabFact's layout) -- accuracy, robustness, scaling.

Input, in the layout of ``../shared/data/tabfact``: ``--tables DIR`` (``#``-separated tables,
header first), ``--train FILE`` (JSON Lines: ``table``, ``statement``, ``label``, ...) and
optionally ``--test FILE`` (the same). Everything goes through the product: the tables and
statements are ingested (parsers.tables), the task is a catalogue task (texts joined to their
tables, training.tasks.table_task; kind multiclass over the labels, so a prediction is the argmax),
and each variant is trained by ``stage_sequences`` + ``stage_train`` (MLflow runs included).

**accuracy** (``{variant: {"accuracy", "perturbed_accuracy", "variation", "test_statements"}}``):

* ``dense``, ``mate``, ``tableformer``: the table-text encoder of training mode ``table``
  (seqenc.table_model) with that ``table_attention``, from scratch; ``mafid``: the MAFiD-style
  model of the same mode (seqenc.mafid: rows encoded apart, single-row attention, low-dim EMA
  across rows, gated fusion), from scratch; ``mafid_no_ema``, ``mafid_full_ema``,
  ``mafid_no_gate``: its ablations (MAFID_ABLATIONS), on request; each of these with the suffix
  ``_minilm`` (``dense_minilm``, ``mafid_no_ema_minilm``, ...): the same model initialised from
  the offline MiniLM (seqenc.pretrained.load_bert_table_encoder: embeddings and BERT layers; what
  BERT has no counterpart for keeps its own init), trained at the fine-tuning rate, on request;
  and any of those with the suffix ``_wide`` (``mate_wide``, ``dense_minilm_wide``): the same
  encoder whose classifier also reads the features of ``checks_lr`` (wide and deep,
  ``TableConfig.table_wide``; ``table_wide_features`` "overlap" reads ``overlap_lr``'s alone) -- its own row, beside the pure encoder, never instead of it;
* ``tvmka``: TVM-KA over the columns' S(k) and the statement's (interleaved training), from
  scratch; ``tvmka_minilm``: the same initialised from the offline MiniLM checkpoint;
* baselines: ``majority`` (the train split's most frequent label), ``bow_lr`` (a logistic
  regression on the statement's TF-IDF words and word pairs; it never sees the table) and
  ``overlap_lr`` (a logistic regression on how many of the statement's words its table holds:
  :func:`overlap_features`; it reads the table, but only as bags of words per row -- the floor a
  table model has to pass to show it reads more than word matches), and ``row_match_lr`` (a
  logistic regression on how many things of the statement each row names: :func:`row_match_features`,
  the counts behind the encoders' row-match ids without an encoder -- the peer that shows what an
  encoder learns beyond its input feature), and ``checks_lr`` (a logistic regression on what a wide
  head reads by default: the overlap features, the row-match counts and the checks of one-step
  programs, seqenc.table_checks), and ``checks_mlp`` (the same features standardised into one
  hidden layer of ``WIDE_HIDDEN`` units, scikit-learn's MLP: the form of the default wide head, so
  the like-for-like peer of every ``_wide`` row: what the features give without an encoder).

The split is by table (the task's ``grouped`` split, seeded: no test table was seen in
training). Without ``--test`` the train file's test split is the test set; with it, the test
file's statements are (the task's ``split_key``), and the train file is split into train and
dev only, by table (its test share goes to train). **Perturbation**: every table
again with its rows and its columns shuffled (a seed per table), ingested into a second data
root; the same test statements are scored against those tables. ``perturbed_accuracy`` is the
accuracy there, ``variation`` the share of test statements whose prediction changed
(TableFormer's "variation percentage"). Settings (model size, steps) are the ``--size``'s,
chosen before any test figure was seen; ``--config`` overrides them, for every variant
(``model``, ``train``) or for one (``variants.<name>.model`` / ``.train``, e.g. fewer steps for
the pre-trained MiniLM, whose every step costs ~30 times a demo model's).

**scaling** (``[{"variant", "tokens", "seconds", "peak_mb", "status"}]``): one forward and
backward pass of the table encoders ``dense``, ``mate_mask``, ``mate``, ``tableformer`` at
``scaling_tokens`` tokens, and of one ``ema_lowdim`` or ``attention`` layer across
``layer_positions`` positions (training.bench.table_scaling).
"""

from __future__ import annotations

import functools
import json
import logging
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from parsers.names import check_name
from seqenc.heads import WIDE_HIDDEN
from seqenc.table_checks import row_match_features, wide_features
from seqenc.table_inputs import WORD, overlap_features
from training.bench.table_variants import DEFAULT_VARIANTS, MAFID_ABLATIONS, MINILM, TABLE_VARIANTS, VARIANTS, WIDE

__all__ = ["DEFAULT_VARIANTS", "TABLE_VARIANTS", "VARIANTS", "bench_tables", "overlap_features", "perturb_table",
           "row_match_features", "table_words"]

log = logging.getLogger(__name__)

BASELINES = ("majority", "bow_lr", "overlap_lr")
TABLES, STATEMENTS, TASK = "tables", "statements", "verify"
# the table encoders' input settings (TableConfig): positions per cell, 512 tokens of text + table
TABLE_MODEL = {"max_positions": 80, "max_table_tokens": 512, "max_cell_tokens": 16, "max_text_tokens": 64}
SPLIT_KEY = "bench_split"  # with --test: the test file's statements carry "test" here (Task.split_key)
CATALOG = """# seqenc bench tables: the ingested tables and statements, and the verification task
[sources.{tables}]
kind = "tables"
delimiter = "#"

[sources.{statements}]
kind = "texts"
text_field = "statement"
label_field = "label"

[tasks.{task}]
source = "{statements}"
kind = "multiclass"
table_source = "{tables}"
split = "grouped"
"""


@dataclass
class TablesBenchSettings:
    tables: str
    train: str
    test: str | None = None
    variants: tuple[str, ...] = DEFAULT_VARIANTS
    size: str = "demo"
    # {"model": ..., "train": ..., "variants": {variant: {"model": ..., "train": ...}}} on top of the size's
    config: dict = field(default_factory=dict)
    seed: int = 0
    max_tables: int | None = None  # a seeded sample of the train file's tables (quick runs)
    reuse_trained: bool = False  # score a variant already trained in the workdir instead of training it
    scaling_tokens: tuple[int, ...] = (512, 1024, 2048, 4096, 8192)
    layer_positions: tuple[int, ...] = (1024, 4096, 16384, 65536)  # ema_lowdim vs attention
    max_mb: int = 8192
    max_seconds: float = 300.0
    repeat: int = 2
    threads: int = 2  # torch threads of a scaling child
    jobs: int = 0  # variants trained at once, each in its own process (0: torch's threads; training.bench.table_jobs)


# --- data -------------------------------------------------------------------------------------
def _statements(path: Path, tables: set[str] | None) -> list[str]:
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    return lines if tables is None else [x for x in lines if json.loads(x)["table"] in tables]


def perturb_table(text: str, seed: int) -> str:
    """A ``#``-separated table with its data rows and its columns shuffled (the header follows
    its columns)."""
    rows = [line.split("#") for line in text.splitlines() if line.strip()]
    rng = random.Random(seed)
    cols = list(range(len(rows[0])))
    rng.shuffle(cols)
    body = rows[1:]
    rng.shuffle(body)
    return "\n".join("#".join(r[c] for c in cols) for r in [rows[0], *body]) + "\n"


def prepare(s: TablesBenchSettings, work: Path) -> dict:
    """Ingest the tables (as given, and perturbed into a second root) and the statements: the
    train file's, and with ``--test`` the test file's marked ``SPLIT_KEY = "test"`` (the task's
    split_key: they are the test split, and the train file is split into train and dev only)."""
    from parsers.tables import ingest_table, ingest_text

    work.mkdir(parents=True, exist_ok=True)
    train_lines = _statements(Path(s.train), None)
    if s.max_tables:
        names = sorted({json.loads(x)["table"] for x in train_lines})
        train_lines = _statements(Path(s.train), set(random.Random(s.seed).sample(names, min(s.max_tables, len(names)))))
    test_lines = _statements(Path(s.test), None) if s.test else []
    (work / "train.jsonl").write_text("\n".join(train_lines) + "\n")
    if test_lines:
        (work / "test.jsonl").write_text("".join(json.dumps({**json.loads(x), SPLIT_KEY: "test"}) + "\n"
                                                 for x in test_lines))
    needed = sorted({json.loads(x)["table"] for x in train_lines + test_lines})
    for name in needed:  # a statement's table name becomes a path under --tables and the workdir
        check_name(name, "table name")
    catalog = work / "seqenc.toml"
    catalog.write_text(CATALOG.format(tables=TABLES, statements=STATEMENTS, task=TASK)
                       + (f'split_key = "{SPLIT_KEY}"\n' if test_lines else ""))
    perturbed_dir = work / "perturbed_tables"
    perturbed_dir.mkdir(exist_ok=True)
    for root, folder in ((work / "data", Path(s.tables)), (work / "perturbed", perturbed_dir)):
        for name in needed:
            if folder == perturbed_dir:
                (perturbed_dir / name).write_text(perturb_table((Path(s.tables) / name).read_text(),
                                                                s.seed * 1_000_003 + sum(map(ord, name))))
            ingest_table(folder / name, root, source=TABLES, delimiter="#", ingest_date="2025-01-01")
    for root in (work / "data", work / "perturbed"):
        for name in ("train.jsonl", "test.jsonl")[:2 if test_lines else 1]:
            ingest_text(work / name, root, source=STATEMENTS, text_field="statement", label_field="label",
                        ingest_date="2025-01-01")
    return {"catalog": str(catalog), "tables": len(needed), "train_statements": len(train_lines),
            "test_statements_file": len(test_lines)}


# --- accuracy ---------------------------------------------------------------------------------
def _test_objects(root: Path, test_ids: list[str]):
    import polars as pl

    from training.tasks.table_task import example_objects

    objects = example_objects(root, STATEMENTS, None, TABLES, "table").collect()
    return objects.filter(pl.col("sequence_id").is_in(test_ids))


def _labels(root: Path, source: str) -> dict[str, str]:
    from parsers import storage

    labels = storage.read_labels(root, source)
    return dict(zip(labels["sequence_id"].to_list(), labels["label"].to_list()))


def _scores(predicted, perturbed, labels: dict[str, str]) -> dict:
    a = dict(zip(predicted["sequence_id"].to_list(), predicted["prediction"].to_list()))
    b = dict(zip(perturbed["sequence_id"].to_list(), perturbed["prediction"].to_list()))
    ids = sorted(set(a) & set(labels))
    top = max(Counter(a[i] for i in ids).values())
    return {"accuracy": sum(a[i] == labels[i] for i in ids) / len(ids),
            "perturbed_accuracy": sum(b[i] == labels[i] for i in ids) / len(ids),
            "variation": sum(a[i] != b[i] for i in ids) / len(ids), "test_statements": len(ids),
            "top_prediction_share": top / len(ids)}  # 1.0: one class for every statement (variation 0 trivially)


def train_variant(variant: str, s: TablesBenchSettings, work: Path, catalog: str, progress: bool) -> tuple[Path, dict]:
    """Train one variant; returns (its bundle, its training result)."""
    from training.pipeline.stages import stage_sequences, stage_train
    from training.tasks.spec import resolve_task

    wide = {"table_wide": True} if variant.endswith(WIDE) else {}
    base = variant.removesuffix(WIDE).removesuffix(MINILM)
    pretrained = "minilm" if variant.removesuffix(WIDE).endswith(MINILM) else None
    mode = "interleaved" if base == "tvmka" else "table"
    own = s.config.get("variants", {}).get(variant, {})  # this variant's overrides win
    ablation = MAFID_ABLATIONS.get(base, {})
    attention = {"table_attention": "mafid" if ablation else base}
    model = {**(TABLE_MODEL | attention | ablation | wide if mode == "table" else {}), **s.config.get("model", {}),
             **own.get("model", {})}
    # a scratch table encoder trains as the size's table_train says (training.engine.sizes), as under
    # `seqenc train --mode table`; --config and the variant's own overrides win
    train = {**s.config.get("train", {}), **own.get("train", {})} or None
    if pretrained:
        model = {k: v for k, v in model.items() if k not in ("max_positions",)}
    out = work / variant
    stage_sequences(str(out), resolve_task(catalog, TASK), s.size, s.seed, pretrained=pretrained,
                    data_root=str(work / "data"), model_overrides=model, progress=progress)
    result = stage_train(str(out), TASK, s.size, s.seed, progress=progress, pretrained=pretrained, mode=mode,
                         train_overrides=train, model_overrides=model,
                         data_root=str(work / "data"), tracking_dir=str(work))
    return Path(result["model_dir"]), result


def _trained(work: Path, variant: str) -> tuple[Path, dict] | None:
    """A variant an earlier run of the bench trained in ``work`` to the end (its bundle and its
    metrics.json exist): (bundle, result) as train_variant gives them; else None."""
    bundle = work / variant / "models" / TASK / "bundle"
    metrics = work / variant / "plots" / TASK / "metrics.json"
    if not (bundle / "metadata.json").is_file() or not metrics.is_file():
        return None
    run_id = json.loads((bundle / "metadata.json").read_text()).get("mlflow_run_id")
    log.info("bench tables %s: reusing the model trained in %s", variant, bundle)
    return bundle, {"run_id": run_id, "metrics": json.loads(metrics.read_text()), "reused": True}


def table_words(table: str) -> list[set[str]]:
    """A ``#``-separated table's rows (header first), each as its set of lower-cased ``\\w+`` words."""
    return [set(WORD.findall(line.replace("#", " ").lower())) for line in table.splitlines() if line.strip()]


def table_rows(table: str) -> tuple[list[str], list[list[str]]]:
    """A ``#``-separated table's header and data rows, lower-cased."""
    lines = [line.lower().split("#") for line in table.splitlines() if line.strip()]
    return (lines[0], lines[1:]) if lines else ([], [])


def baselines(work: Path, train_ids: list[str], test_ids: list[str], labels: dict[str, str], tables: Path,
              seed: int = 0) -> dict:
    """``majority``, ``bow_lr``, ``overlap_lr``, ``row_match_lr``, ``checks_lr`` and ``checks_mlp``
    (module docstring) on the same
    split; the two regressions on the table read each statement's table from ``tables`` and, for
    ``perturbed_accuracy``, its shuffled copy."""
    import numpy as np
    import polars as pl
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from parsers import storage

    frame = storage.read_objects(work / "data", STATEMENTS)
    text_of, table_of = {}, {}
    for key, into in (("statement", text_of), ("table", table_of)):
        part = frame.filter(pl.col("key") == key)
        into.update(zip(part["sequence_id"].to_list(), part["value"].to_list()))
    test, test_labels = test_ids, labels
    y_train = [labels[i] for i in train_ids]
    values, counts = np.unique(y_train, return_counts=True)
    majority = values[counts.argmax()]
    vec = TfidfVectorizer(ngram_range=(1, 2), min_df=2)
    lr = LogisticRegression(max_iter=2000, C=1.0).fit(vec.fit_transform([text_of[i] for i in train_ids]), y_train)
    predicted = lr.predict(vec.transform([text_of[i] for i in test]))

    rows_of = functools.cache(lambda path: table_words(path.read_text()))  # a table serves many statements

    def overlap(ids: list[str], folder: Path) -> np.ndarray:
        return np.array([overlap_features(text_of[i], rows_of(folder / table_of[i])) for i in ids])

    cells_of = functools.cache(lambda path: table_rows(path.read_text()))

    def row_match(ids: list[str], folder: Path) -> np.ndarray:
        return np.array([row_match_features(text_of[i], *cells_of(folder / table_of[i])) for i in ids])

    def checks(ids: list[str], folder: Path) -> np.ndarray:
        return np.array([wide_features("checks", text_of[i], *cells_of(folder / table_of[i])) for i in ids])

    read = {}
    for names, features in ((("overlap_lr",), overlap), (("row_match_lr",), row_match),
                            (("checks_lr", "checks_mlp"), checks)):
        # each feature set once: train, test, and test against the shuffled tables
        X_train, X_test, X_shuffled = (features(train_ids, tables), features(test, tables),
                                       features(test, work / "perturbed_tables"))
        for name in names:
            model = MLPClassifier((WIDE_HIDDEN,), max_iter=500, random_state=seed) if name == "checks_mlp" else \
                LogisticRegression(max_iter=2000)
            fitted = make_pipeline(StandardScaler(), model).fit(X_train, y_train)
            read[name] = (list(fitted.predict(X_test)), list(fitted.predict(X_shuffled)))
    out = {}
    for name, (pred, shuffled) in {"majority": ([majority] * len(test),) * 2, "bow_lr": (list(predicted),) * 2,
                                   **read}.items():
        out[name] = {"accuracy": float(np.mean([p == test_labels[i] for p, i in zip(pred, test)])),
                     "perturbed_accuracy": float(np.mean([p == test_labels[i] for p, i in zip(shuffled, test)])),
                     "variation": float(np.mean([a != b for a, b in zip(pred, shuffled)])),
                     "test_statements": len(test), "top_prediction_share": max(Counter(pred).values()) / len(test)}
    return out


def evaluate_variant(variant: str, s: TablesBenchSettings, work: Path, catalog: str, labels: dict[str, str],
                     progress: bool) -> dict:
    """Train one variant (or reuse it, ``reuse_trained``) and score the test statements against the
    tables as given and perturbed: ``{"accuracy": row, "run": ..., "test_ids": [...]}``. Runs in a
    worker process when variants train side by side (training.bench.table_jobs)."""
    import polars as pl

    from training.serving.scoring import load_bundle, score_objects

    t0 = time.perf_counter()
    trained = _trained(work, variant) if s.reuse_trained else None
    bundle_dir, result = trained or train_variant(variant, s, work, catalog, progress)
    split = pl.read_parquet(work / variant / "sequences" / TASK / "splits.parquet")
    test_ids = split.filter(pl.col("split") == "test")["sequence_id"].to_list()
    bundle = load_bundle(bundle_dir)
    predicted = score_objects(bundle, _test_objects(work / "data", test_ids), progress=False)
    perturbed = score_objects(bundle, _test_objects(work / "perturbed", test_ids), progress=False)
    accuracy = _scores(predicted, perturbed, labels)
    log.info("bench tables %s: %s", variant, accuracy)
    return {"accuracy": accuracy, "test_ids": test_ids,
            "run": {"seconds": round(time.perf_counter() - t0, 1), "run_id": result["run_id"],
                    "dev": result["metrics"]["dev"], "reused": result.get("reused", False)}}


def bench_accuracy(s: TablesBenchSettings, work: Path, progress: bool = True) -> dict:
    import polars as pl

    from training.bench.table_jobs import plan, run_variants
    from training.serving import tracking

    t0 = time.perf_counter()
    prepared = prepare(s, work)
    labels = _labels(work / "data", STATEMENTS)
    tracking.use_store(work)  # the store and its experiment exist before any worker writes to them
    tracking.experiment_id(work)
    workers, threads = plan(s.jobs, len(s.variants))
    rows = run_variants(evaluate_variant, list(s.variants), s.jobs, s, work, prepared["catalog"], labels, progress)
    # the same data and seed: every variant's split is the first's (checked, never assumed)
    first = s.variants[0]
    split = pl.read_parquet(work / first / "sequences" / TASK / "splits.parquet")
    test_ids = rows[first]["test_ids"]
    for variant, row in rows.items():
        if sorted(row["test_ids"]) != sorted(test_ids):
            raise RuntimeError(f"bench tables: {variant}'s test split differs from {first}'s; "
                               "remove the workdir and run again")
    accuracy = {v: row["accuracy"] for v, row in rows.items()}
    runs = {v: row["run"] for v, row in rows.items()}
    train_ids = split.filter(pl.col("split") == "train")["sequence_id"].to_list()
    accuracy.update(baselines(work, train_ids, test_ids, labels, Path(s.tables), s.seed))
    return {"accuracy": accuracy, "runs": runs, "data": prepared,
            "split": {name: int((split["split"] == name).sum()) for name in ("train", "dev", "test")},
            "jobs": {"workers": workers, "threads_each": threads},
            "seconds": round(time.perf_counter() - t0, 1)}


# --- the whole bench --------------------------------------------------------------------------
def bench_tables(s: TablesBenchSettings, workdir: str | Path, progress: bool = True, accuracy: bool = True,
                 scaling: bool = True) -> dict:
    work = Path(workdir).resolve()
    out: dict = {"settings": asdict(s)}
    if accuracy:
        out.update(bench_accuracy(s, work, progress))
    if scaling:
        from training.bench.table_scaling import bench_scaling

        out["scaling"] = bench_scaling(s, progress)
    return out


def tables_table(r: dict) -> str:
    lines = []
    if "accuracy" in r:
        lines += ["| variant | accuracy | perturbed accuracy | variation | most predicted class share | test statements |",
                  "|---|---:|---:|---:|---:|---:|"]
        for name, a in r["accuracy"].items():
            lines.append(f"| {name} | {a['accuracy']:.3f} | {a['perturbed_accuracy']:.3f} | {a['variation']:.3f} | "
                         f"{a.get('top_prediction_share', float('nan')):.3f} | {a['test_statements']} |")
        lines.append("")
    if "scaling" in r:
        lines += ["| variant | tokens | seconds | peak MB | added MB | status | time / baseline | "
                  "added MB / baseline |", "|---|---:|---:|---:|---:|---|---:|---:|"]
        for x in r["scaling"]:
            lines.append(f"| {x['variant']} | {x['tokens']} | {x['seconds'] if x['seconds'] is not None else '-'} | "
                         f"{x['peak_mb'] if x['peak_mb'] is not None else '-'} | {x.get('added_mb', '-')} | "
                         f"{x['status']}{' (pred.)' if x.get('predicted') else ''} | "
                         f"{x.get('time_vs_baseline', '-')} | {x.get('memory_vs_baseline', '-')} |")
    return "\n".join(lines)


def plot_tables(r: dict, path: Path) -> list[Path]:
    """``<path>-accuracy.png`` (accuracy and perturbed accuracy per variant) and
    ``<path>-scaling.png`` (seconds and peak MB against tokens)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    if "accuracy" in r:
        names = list(r["accuracy"])
        fig, ax = plt.subplots(figsize=(7, 3.5))
        xs = range(len(names))
        ax.bar([x - 0.2 for x in xs], [r["accuracy"][n]["accuracy"] for n in names], 0.4, label="accuracy")
        ax.bar([x + 0.2 for x in xs], [r["accuracy"][n]["perturbed_accuracy"] for n in names], 0.4,
               label="rows and columns shuffled")
        ax.set_xticks(list(xs), names, rotation=20)
        ax.set_ylim(0, 1)
        ax.legend()
        ax.set_title("table-text verification, test split by table")
        fig.tight_layout()
        written.append(path.with_name(path.stem + "-accuracy.png"))
        fig.savefig(written[-1], dpi=120)
        plt.close(fig)
    if "scaling" in r:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.5))
        for v in sorted({x["variant"] for x in r["scaling"]}, key=[x["variant"] for x in r["scaling"]].index):
            pts = [(x["tokens"], x["seconds"], x["peak_mb"]) for x in r["scaling"] if x["variant"] == v and x["status"] == "ok"]
            if pts:
                a1.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=v)
                a2.plot([p[0] for p in pts], [p[2] for p in pts], marker="o", label=v)
        for ax, label in ((a1, "seconds (forward + backward)"), (a2, "peak MB")):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("tokens")
            ax.set_ylabel(label)
        a1.legend()
        fig.tight_layout()
        written.append(path.with_name(path.stem + "-scaling.png"))
        fig.savefig(written[-1], dpi=120)
        plt.close(fig)
    return written
