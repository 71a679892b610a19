"""The ``seqenc`` command.

    seqenc demo --out DIR          the main job on the built-in data (generate, ingest, train, score)
    seqenc ingest logs FILE ...    raw logs -> Drain3 -> Parquet key-value objects (--labels CSV, --workers N)
    seqenc ingest events FILE ...  JSON Lines events -> Parquet key-value objects (--labels CSV)
    seqenc ingest table FILE ...   tables (CSV / TSV / #-separated / Parquet): rows = objects, columns = keys
    seqenc ingest text FILE ...    texts (JSON Lines records or plain text) -> objects, one per text unit
    seqenc profile --root ROOT --source S   per key: distinct values, share, unique per object; a starter task
    seqenc tasks [--catalog FILE]  the declared tasks, with ingested / labelled sequences per class
    seqenc train --workdir DIR --task T [--catalog FILE] [--mode M]   one training job (--resume JOB)
    seqenc evaluate --workdir DIR --task T [--root R] [--model URI] [--split S | --date D]   a task's metrics
    seqenc score --model URI_OR_DIR --input PARQUET_DIR --out DIR   batch scoring, partitioned by date
    seqenc bench model --json OUT  TVM-KA vs flattened BERT (cut at the window and whole): time, peak memory
    seqenc logformat suggest FILE  a header for a log file of unknown layout (first line), and a formats JSON
    seqenc bench parse --loghub DIR [--loghub DIR] --json OUT   GA, PA, leave-one-system-out GA vs Drain3 ([--formats F] [--auto-header])
    seqenc bench ingest --lines N --json OUT     ingest throughput vs a Drain3 loop (cached and not), peak RSS;
                                                 [--workers 1,2,4] parallel ingest rows
    seqenc bench accuracy --data DIR --json OUT  every training mode + count baselines, same splits (docs/benchmarks.md)
    seqenc bench score --json OUT  batch-scoring throughput, batched vs one sequence at a time
    seqenc bench sequences --json OUT            value-sequence building over days: buckets vs one pass, peak RSS
    seqenc bench tables --tables DIR --train FILE --json OUT   table encoders vs baselines, perturbation, scaling
    seqenc bench table-lookup --tables DIR --from FILE --out FILE   cell-lookup statements over real tables
    seqenc bench depth --json OUT  KA depth x init (default + warm-up, default, DT-Fixup) over a frozen MiniLM TVM
    seqenc ui [--workdir DIR]      the MLflow UI on a work directory's runs

Heavy modules are imported inside each command so that ``seqenc --help`` answers at once.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from seqenc.config import TABLE_ATTENTIONS, TableConfig
from training.cli.args import config_arg, positive_int
from training.cli.ingest import add_ingest_parser


def _print_summary(summary: dict) -> None:
    rows = []
    for task, metrics in summary["metrics"].items():
        rows.append((task, "TVM-KA", "  ".join(f"{k}={v:.3f}" for k, v in metrics.items())))
        # beside it: the floor (one constant prediction: every sequence flagged, or the train split's
        # majority class), the simplest model on the same split (what TVM-KA adds) and, for next_item,
        # the sequence's own items, most frequent first
        for label, part in (("floor", "floors"), ("counts LR", "baselines"), ("own items", "history_baselines")):
            peer = (summary.get(part) or {}).get(task)
            if peer:
                shown = {k: v for k, v in peer.items() if k in metrics and isinstance(v, int | float)}
                rows.append(("", label, "  ".join(f"{k}={v:.3f}" for k, v in shown.items())))
    width = max(len(t) for t, _, _ in rows)
    print("\nseqenc demo — test-split metrics (TVM-KA, interleaved training; floor: every sequence flagged (binary) "
          "or the train split's majority class; counts LR: logistic regression on value counts, same split; own "
          "items: a sequence's items, most frequent first)")
    print("-" * 96)
    for task, model, text in rows:
        print(f"{task:<{width}}  {model:<9}  {text}")
    print("-" * 96)
    print(f"wall time: {summary['seconds']:.1f} s")
    print("predictions:")
    for path in summary["predictions"]:
        print(f"  {path}")
    from training.serving.tracking import ui_command

    print(f"MLflow runs: {', '.join(summary['run_ids'])}")
    print(f"open the MLflow UI:  {ui_command(summary['mlflow_tracking_uri'])}")


def cmd_demo(args) -> int:
    from training.engine.sizes import resolve_size
    from training.pipeline.stages import run_demo

    summary = run_demo(args.out, size=resolve_size(args.size, None), seed=args.seed, progress=not args.no_progress,
                       pretrained=args.pretrained, pretrained_layers=args.pretrained_layers, catalog=args.catalog)
    _print_summary(summary)
    print(f"summary: {args.out}/summary.json")
    return 0


def cmd_profile(args) -> int:
    from parsers.profile import profile_source, profile_table
    from training.tasks.starter import append_task, starter_task, task_toml

    profile = profile_source(args.root, args.source)
    if args.json:
        print(json.dumps(profile, indent=2))
    else:
        print(profile_table(profile))
    task = starter_task(profile)
    name = args.task_name or f"{args.source}_{task['kind']}"
    if args.write_task:
        source = {"kind": profile["kind"]}
        text = append_task(args.write_task, name, task, source_table=source)
        print(f"\nappended to {args.write_task}:\n{text}")
    else:
        print(f"\nstarter task (add it with --write-task CATALOG):\n{task_toml(name, task)}")
    return 0


def cmd_logformat_suggest(args) -> int:
    from parsers.header_detect import read_sample, suggest_header

    path = Path(args.file)
    if not path.is_file():
        raise FileNotFoundError(f"no log file {path}: give the path of a raw log file")
    suggestion = suggest_header(read_sample(path, args.lines))
    name = args.name or "".join(c if c.isalnum() else "_" for c in path.name.split(".")[0].lower()) or "mylog"
    print(suggestion.header)
    print(json.dumps({"formats": {name: suggestion.format_spec()}}))
    print(f"# {suggestion.coverage:.1%} of {suggestion.sample} sample lines match; fields: "
          f"{', '.join(suggestion.fields) or 'none (the whole line is Content)'}; timestamp: "
          f"{suggestion.ts_format or 'none found'}. Save the JSON line as a formats file and pass "
          f"--formats FILE --preset {name} to seqenc ingest logs (or ingest with --auto-header)")
    return 0


def cmd_tasks(args) -> int:
    from training.tasks.listing import task_rows, tasks_table

    rows = task_rows(args.catalog, args.root)
    print(json.dumps(rows, indent=2) if args.json else tasks_table(rows))
    return 0


def cmd_evaluate(args) -> int:
    from training.serving.evaluate import evaluate_task, task_of_workdir

    task = task_of_workdir(args.workdir, args.task, args.catalog)  # resolved once, here
    result = evaluate_task(args.workdir, task, model=args.model, split=args.split,
                           dates=args.date, tracking_dir=args.tracking_dir, progress=not args.no_progress,
                           data_root=args.root)
    print(json.dumps(result, indent=2))
    return 0


def cmd_train(args) -> int:
    from training.pipeline.stages import resume_train, run_train

    if args.resume:
        result = resume_train(args.resume, progress=not args.no_progress, device=args.device)
    else:
        if not (args.workdir and args.task):
            raise SystemExit("seqenc train: --workdir and --task are required (or --resume JOB_DIR)")
        config = config_arg(args.config)
        if args.preset:  # under --config
            from training.engine.sizes import TRAINING_PRESETS

            preset = TRAINING_PRESETS[args.preset]
            config = {part: {**preset.get(part, {}), **config.get(part, {})} for part in set(preset) | set(config)}
        if args.deepspeed:
            config.setdefault("train", {})["deepspeed"] = str(Path(args.deepspeed).resolve())
        if args.device:
            config.setdefault("train", {})["device"] = args.device
        from training.tasks.spec import resolve_task

        task = resolve_task(args.catalog, args.task)  # the task, resolved once for everything below
        result = run_train(args.workdir, task, size=args.size, seed=args.seed, mode=args.mode, config=config,
                           pretrained=args.pretrained, pretrained_layers=args.pretrained_layers,
                           progress=not args.no_progress, data_root=args.root)
    from training.engine.deepspeed_engine import exit_rank, finish_distributed

    several = finish_distributed()  # data-parallel ranks leave their process group together (a no-op otherwise)
    print(json.dumps({k: result[k] for k in ("metrics", "run_id", "model_dir", "job_dir", "data_parallel")
                      if k in result}, indent=2))
    if result.get("tracking_uri"):  # rank 0 (other data-parallel ranks log nothing)
        from training.serving.tracking import ui_command

        print(f"MLflow UI: {ui_command(result['tracking_uri'])}")
    if several:
        exit_rank(0)  # one rank of several: no interpreter teardown (training.engine.deepspeed_engine)
    return 0


def cmd_ui(args) -> int:
    """The MLflow UI on a work directory's store, in the foreground until Ctrl-C."""
    import os
    import signal
    import subprocess

    from training.serving import tracking

    workdir = args.workdir or os.environ.get("SEQENC_WORKDIR") or "demo-out"
    uri, artifacts = tracking.ui_store(workdir, args.backend_store_uri)
    if tracking.is_server_uri(uri):
        print(f"MLflow UI: {uri}")
        print("(runs are tracked on that server (MLFLOW_TRACKING_URI or --backend-store-uri); "
              "open it there, nothing is started here)")
        return 0
    if uri.startswith("sqlite:") and not tracking.sqlite_path(uri).exists():
        raise SystemExit(f"seqenc ui: no MLflow store at {tracking.sqlite_path(uri)}; it is created by "
                         f"`seqenc demo --out {workdir}` or `seqenc train --workdir {workdir} --task ...` "
                         "(or pass --workdir / --backend-store-uri)")
    cmd = tracking.ui_server_command(uri, artifacts, args.host, args.port, args.workers)
    shown = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
    print(f"MLflow UI: http://{shown}:{args.port}", flush=True)
    print(f"store: {uri}" + (f"  artifacts: {artifacts}" if artifacts else "") + "  (Ctrl-C stops it)",
          flush=True)
    # MLflow 3's server also starts a job runner with seven huey consumer processes (GenAI jobs:
    # judges, trace rollups) that seqenc never uses; they cost tens of CPU-seconds and outlive a
    # stopped server by as long. Off unless the user asks for them.
    env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ}
    # Same process group: Ctrl-C reaches mlflow directly; a SIGTERM to us is passed on (mlflow
    # hands it to its uvicorn workers).
    proc = subprocess.Popen(cmd, env=env)
    signal.signal(signal.SIGTERM, lambda signum, frame: proc.terminate())
    try:
        return proc.wait()
    except KeyboardInterrupt:
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        return 0


def cmd_score(args) -> int:
    from training.serving.batch_score import score_partitions

    result = score_partitions(args.model, args.input, args.out, source=args.source, dates=args.date,
                              tracking_dir=args.tracking_dir, progress=not args.no_progress, device=args.device,
                              chunk_sequences=args.chunk_sequences)
    version = f" version {result['model_version']}" if result["model_version"] else ""
    for day in result["dates"]:
        flagged = (f"; flagged {day['flagged']} ({day['flagged_share']:.1%}) by {day['threshold_rule']}"
                   if "flagged" in day else "")
        in_sample = (f"; {day['read_in_training']} of the {day['sequences']} in the model's training split (scored "
                     "in-sample)" if day.get("read_in_training") else "")
        print(f"{day['date']}: scored {day['sequences']} sequences of {result['source']} with "
              f"{result['model_uri']}{version} -> {day['predictions']}{flagged}{in_sample}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from training.cli.bench import add_bench_parser
    from training.engine.modes import SELECTABLE, mode_help
    from training.engine.sizes import SIZES, TRAINING_PRESETS

    parser = argparse.ArgumentParser(prog="seqenc", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="run the whole pipeline on the built-in data")
    demo.add_argument("--out", required=True, help="output directory (data, models, MLflow store, summary.json)")
    demo.add_argument("--size", default=None, choices=list(SIZES),
                      help="built-in data and model size (default: $SEQENC_SIZE, else demo)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--pretrained", default=None, metavar="minilm|DIR",
                      help="initialise TVM and KA from a BERT checkpoint (minilm = the bundled MiniLM-L6-H384; "
                           "slow on CPU: 384 wide, 6 layers)")
    demo.add_argument("--pretrained-layers", type=int, default=None, metavar="N",
                      help="keep only the checkpoint's first N layers (default: all)")
    demo.add_argument("--catalog", default=None, metavar="TOML",
                      help="catalogue of the demo (default: the built-in one; sources need a demo_generator)")
    demo.add_argument("--no-progress", action="store_true", help="hide progress bars")
    demo.set_defaults(func=cmd_demo)

    add_ingest_parser(sub)

    profile = sub.add_parser("profile", help="per key of an ingested source: distinct values, share, unique per "
                             "object, numeric; and a starter task for the catalogue")
    profile.add_argument("--root", required=True, help="data root (as given to seqenc ingest)")
    profile.add_argument("--source", required=True)
    profile.add_argument("--write-task", default=None, metavar="CATALOG",
                         help="append the starter task (and the source, when undeclared) to this catalogue file")
    profile.add_argument("--task-name", default=None, help="the starter task's name (default: SOURCE_KIND)")
    profile.add_argument("--json", action="store_true", help="print the profile as JSON")
    profile.set_defaults(func=cmd_profile)

    tasks = sub.add_parser("tasks", help="the catalogue's tasks; with --root, ingested and labelled sequences per class")
    tasks.add_argument("--catalog", default=None, metavar="TOML")
    tasks.add_argument("--root", default=None, help="data root to count sequences in")
    tasks.add_argument("--json", action="store_true")
    tasks.set_defaults(func=cmd_tasks)

    train = sub.add_parser("train", help="train one catalogue task on ingested data (all modes, resumable)",
                           description="Builds value sequences from WORKDIR/data (see `seqenc ingest`, or "
                           "`seqenc demo`), trains, evaluates, logs to MLflow and saves a model bundle. A killed "
                           "job continues with --resume JOB_DIR (printed as job_dir).")
    train.add_argument("--workdir", help="work directory holding data/ (the --root of seqenc ingest is WORKDIR/data)")
    train.add_argument("--root", default=None, metavar="ROOT",
                       help="data root to read (default WORKDIR/data; a folder or s3://bucket/prefix); the value "
                       "sequences, checkpoints and bundle stay in WORKDIR")
    train.add_argument("--catalog", default=None, metavar="TOML",
                       help="catalogue declaring the task (default: $SEQENC_CATALOG, else the built-in one)")
    train.add_argument("--task", help="a task of the catalogue (seqenc tasks lists them)")
    train.add_argument("--mode", default=None, choices=list(SELECTABLE),
                       help=f"default: the task's, else interleaved. {mode_help()} (the table encoder's attention: "
                       f"--config model.table_attention, {'/'.join(TABLE_ATTENTIONS)}; default "
                       f"{TableConfig.table_attention})")
    train.add_argument("--size", default=None, choices=list(SIZES),
                       help="built-in model and step sizes (default: the task's, else $SEQENC_SIZE, else demo)")
    train.add_argument("--config", default=None, metavar="JSON",
                       help='overrides on top of the task\'s config, inline JSON or a JSON file: {"model": '
                       '{TVMKAConfig fields}, "train": {TrainConfig fields}}')
    train.add_argument("--preset", default=None, choices=sorted(TRAINING_PRESETS),
                       help="named settings under --config: paper = the TVM-KA paper's 2 TVM : 1 KA steps (the sizes "
                       "default to the measured best, 1:10)")
    train.add_argument("--deepspeed", default=None, metavar="DS_JSON", help="train under DeepSpeed with this config")
    train.add_argument("--device", default=None, metavar="DEVICE",
                       help="auto (default: CUDA when present, else CPU), cpu, cuda, cuda:1, mps; under DeepSpeed "
                       "each rank's accelerator decides; with --resume, where the job continues")
    train.add_argument("--resume", default=None, metavar="JOB_DIR", help="continue a job from its last checkpoint")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--pretrained", default=None, metavar="minilm|DIR")
    train.add_argument("--pretrained-layers", type=int, default=None, metavar="N")
    train.add_argument("--no-progress", action="store_true")
    train.set_defaults(func=cmd_train)

    ev = sub.add_parser("evaluate", help="a task's metrics on labelled data with a trained model",
                        description="Scores the task's labelled sequences -- a split of WORKDIR's last training "
                        "(--split, default test) or every labelled sequence of some ingest dates (--date) -- and "
                        "prints the task's metrics as JSON.")
    ev.add_argument("--workdir", required=True, help="work directory holding data/ (and the task's training)")
    ev.add_argument("--root", default=None, metavar="ROOT",
                    help="data root to read (default WORKDIR/data; a folder or s3://bucket/prefix)")
    ev.add_argument("--task", required=True)
    ev.add_argument("--catalog", default=None, metavar="TOML")
    ev.add_argument("--model", default=None, metavar="URI_OR_DIR",
                    help="bundle directory or registry URI (default: WORKDIR's bundle of the task)")
    ev.add_argument("--split", default=None, choices=["train", "dev", "test"])
    ev.add_argument("--date", action="append", default=None, metavar="YYYY-MM-DD", help="ingest date (repeatable)")
    ev.add_argument("--tracking-dir", default=None, metavar="WORKDIR",
                    help="where the MLflow store is for registry URIs (default: --workdir)")
    ev.add_argument("--no-progress", action="store_true")
    ev.set_defaults(func=cmd_evaluate)

    ui = sub.add_parser("ui", help="open the MLflow UI on a work directory's runs (foreground, Ctrl-C stops it)",
                        description="Serves the MLflow UI on WORKDIR/mlflow.db (artifacts from WORKDIR/mlartifacts), "
                        "or on MLFLOW_TRACKING_URI when that names a store; when it names a server (http...), "
                        "prints its URL and starts nothing.")
    ui.add_argument("--workdir", default=None,
                    help="work directory holding mlflow.db (default: $SEQENC_WORKDIR, else demo-out)")
    ui.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    ui.add_argument("--port", type=int, default=5000)
    ui.add_argument("--backend-store-uri", default=None, metavar="URI",
                    help="open this store instead (e.g. sqlite:///path/mlflow.db)")
    ui.add_argument("--workers", type=int, default=1, help="server worker processes (default 1)")
    ui.set_defaults(func=cmd_ui)

    score = sub.add_parser("score", help="batch-score ingested sequences with a model bundle or a registry URI",
                           description="Scores each ingest date of a source (or the --date ones) and writes "
                           "OUT/date=YYYY-MM-DD/part-0.parquet (sequence_id, score, label, prob_<class>..., "
                           "model_name, model_version), replacing that date's earlier output. The same code "
                           "runs in the seqenc_batch_score DAG.")
    score.add_argument("--model", required=True, metavar="URI_OR_DIR",
                       help="a model bundle directory, or models:/NAME@ALIAS (e.g. models:/seqenc-anomaly@champion), "
                            "models:/NAME/VERSION, runs:/RUN_ID/model")
    score.add_argument("--input", required=True, metavar="PARQUET_DIR",
                       help="data root holding objects/source=<src>/ingest_date=<d>/ (seqenc ingest --root)")
    score.add_argument("--out", required=True, metavar="DIR", help="predictions folder, partitioned by date")
    score.add_argument("--source", default=None, help="source to score (default: the model's training source)")
    score.add_argument("--date", action="append", default=None, metavar="YYYY-MM-DD",
                       help="ingest date to score (repeatable; default: every date of the source)")
    score.add_argument("--tracking-dir", default=None, metavar="WORKDIR",
                       help="where the MLflow store is (WORKDIR/mlflow.db) for registry URIs and the scoring runs; "
                            "MLFLOW_TRACKING_URI wins when set")
    score.add_argument("--device", default="auto", metavar="DEVICE",
                       help="where the model scores: auto (default: CUDA when present, else CPU), cpu, cuda, cuda:1, mps")
    score.add_argument("--chunk-sequences", type=positive_int, default=2000, metavar="N",
                       help="sequences scored at a time (memory follows it, not the day's size; default 2000)")
    score.add_argument("--no-progress", action="store_true")
    score.set_defaults(func=cmd_score)

    logformat = sub.add_parser("logformat", help="log formats: propose a header for a log file")
    lsub = logformat.add_subparsers(dest="logformat", required=True)
    suggest = lsub.add_parser("suggest", help="read a sample of a log file and print a proposed header (first line) "
                              "and a one-line formats JSON to paste")
    suggest.add_argument("file", help="raw log file (plain or .gz)")
    suggest.add_argument("--lines", type=int, default=2000, help="sample size: the first N non-blank lines")
    suggest.add_argument("--name", default=None, help="the format's name in the JSON (default: from the file name)")
    suggest.set_defaults(func=cmd_logformat_suggest)

    add_bench_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("alembic", "mlflow.store", "drain3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from parsers.names import UnsafeName, check_name

    try:
        for attr, what in (("source", "source"), ("task", "task"), ("task_name", "task name")):
            if getattr(args, attr, None) is not None:  # before anything is read or written
                check_name(getattr(args, attr), what)
        from parsers.objectstore import check_root

        for attr in ("root", "input", "out"):  # an s3:// data root: reachable, before any work (one line if not)
            check_root(getattr(args, attr, None))
        return args.func(args)
    except UnsafeName as err:  # a name that would become a path: refused, exit code 2
        if args.verbose:
            raise
        print(f"seqenc {args.command}: {err}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError) as err:  # what a user can fix: one line, the traceback with -v
        if args.verbose:
            raise
        raise SystemExit(f"seqenc {args.command}: {err} (add -v before the command for the traceback)") from err


if __name__ == "__main__":
    sys.exit(main())
