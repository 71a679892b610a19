"""``seqenc bench ...``: the benchmark commands (JSON + Markdown table + plot each), apart from
the product commands of training.cli.main. Heavy modules are imported inside each command."""

from __future__ import annotations

import json
from pathlib import Path

from training.bench.ingest import EXECUTORS
from training.bench.table_variants import DEFAULT_VARIANTS
from training.cli.args import config_arg, positive_int


def cmd_bench_accuracy(args) -> int:
    from training.bench.accuracy import accuracy_table, bench_accuracy, write_accuracy_outputs
    from training.bench.data import check_split

    limits = dict((k, int(v)) for k, v in (item.split("=") for item in args.limit)) if args.limit else {}
    workdir = Path(args.workdir or Path(args.json).with_suffix("")).resolve()
    config = config_arg(args.config)
    datasets = args.datasets.split(",")
    try:  # before any training: e.g. --split by_line with a dataset that has no such split
        for name in datasets:
            check_split(name, args.split)
    except ValueError as err:
        raise SystemExit(f"seqenc bench accuracy: {err}") from err
    modes = [] if args.modes == "none" else args.modes.split(",")  # none: the baselines alone
    results, described = bench_accuracy(args.data, workdir, datasets=datasets, modes=modes, size=args.size,
                                        seed=args.seed, limits=limits,
                                        config=config, progress=not args.no_progress,
                                        seeds=[int(x) for x in args.seeds.split(",")] if args.seeds else None,
                                        split=args.split)
    paths = write_accuracy_outputs(results, described, args.json)
    print(accuracy_table(results))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def cmd_bench_model(args) -> int:
    from training.bench.model import ModelBenchSettings, bench_model, table, write_outputs

    settings = ModelBenchSettings(
        n_objects=_ints(args.n_objects), n_keys=_ints(args.n_keys), models=tuple(args.models.split(",")),
        d_model=args.d_model, n_layers=args.n_layers, n_heads=args.n_heads, n_shared_heads=args.n_shared_heads,
        window=args.window, tokens_per_value=args.tokens_per_value, attn_backend=args.attn_backend,
        threads=args.threads, max_mb=args.max_mb, max_seconds=args.max_seconds, repeat=args.repeat,
    )
    result = bench_model(settings, progress=not args.no_progress)
    paths = write_outputs(result, args.json)
    print(table(result))
    print(json.dumps(result["summary"], indent=2))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def cmd_bench_parse(args) -> int:
    from training.bench.parse import bench_parse, parse_table, write_parse_outputs

    result = bench_parse(args.loghub, formats_file=args.formats, auto_header=args.auto_header)
    paths = write_parse_outputs(result, args.json)
    print(parse_table(result))
    if result["below_published_drain"]:
        print("below published Drain GA: " + ", ".join(result["below_published_drain"]))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def cmd_bench_ingest(args) -> int:
    from training.bench.ingest import bench_ingest, ingest_table, plot_parallel

    workers = _int_list(args.workers, "--workers") if args.workers else None
    if args.executor != "process" and not workers:
        raise ValueError(f"--executor {args.executor} runs the files on its workers: give --workers too, e.g. 1,2")
    result = bench_ingest(args.lines, seed=args.seed, workers=workers, loops=not args.no_loops, files=args.files,
                          executor=args.executor)
    _write_result(result, ingest_table, args.json, plot_parallel if workers else None)
    return 0


def _int_list(text: str, flag: str, minimum: int = 1) -> list[int]:
    """``1,2,4`` -> [1, 2, 4]; a ValueError naming the flag otherwise."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{flag} takes whole numbers separated by commas, e.g. 1,2,4; got {text!r}") from None
    if not values or min(values) < minimum:
        raise ValueError(f"{flag} takes numbers >= {minimum}, e.g. 1,2,4; got {text!r}")
    return values


def _write_result(result: dict, table, json_path, plot=None) -> None:
    """A benchmark's JSON at ``json_path``, its Markdown ``table(result)`` beside it, printed; with
    ``plot``, ``plot(result, path)`` draws the PNG beside them too."""
    out = Path(json_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    out.with_suffix(".md").write_text(table(result) + "\n")
    print(table(result))
    print(f"wrote {out}, {out.with_suffix('.md')}")
    if plot is not None:
        plot(result, out.with_suffix(".png"))
        print(f"wrote {out.with_suffix('.png')}")


def cmd_bench_score(args) -> int:
    from training.bench.score import ScoreBenchSettings, bench_score, score_table

    sizes = {k: getattr(args, k) for k in ("chunk_sequences", "small_chunk", "d_model", "n_layers", "n_heads",
                                           "n_shared_heads", "d_ff") if getattr(args, k) is not None}
    settings = ScoreBenchSettings(sequences=args.sequences, baseline_sequences=args.baseline_sequences,
                                  threads=args.threads, seed=args.seed, **sizes)
    out = Path(args.json)
    workdir = Path(args.workdir or out.with_suffix("")).resolve()
    _write_result(bench_score(settings, workdir, progress=not args.no_progress), score_table, out)
    return 0


def cmd_bench_train(args) -> int:
    from training.bench.train_ranks import bench_train, plot_train, train_table

    out = Path(args.json)
    worlds = tuple(_int_list(args.worlds, "--worlds"))
    if 1 not in worlds:
        raise SystemExit(f"seqenc bench train: --worlds {args.worlds} must include 1 (the ratios are against one rank)")
    result = bench_train(Path(args.workdir or out.with_suffix("")), size=args.size, worlds=worlds, seed=args.seed,
                         threads=args.threads, config=config_arg(args.config),
                         deepspeed=config_arg(args.deepspeed) or None)
    _write_result(result, train_table, out, plot_train)
    return 0


def cmd_bench_sequences(args) -> int:
    from training.bench.sequences import bench_sequences, plot_sequences, sequences_table

    out = Path(args.json)
    workdir = Path(args.workdir or out.with_suffix(""))
    result = bench_sequences(workdir, days=args.days, lines_per_day=args.lines_per_day,
                             chunk_sizes=tuple(_int_list(args.chunk_sequences, "--chunk-sequences")),
                             compare_sequences=args.compare_sequences, seed=args.seed, progress=not args.no_progress)
    _write_result(result, sequences_table, out, plot_sequences)
    return 0


def cmd_bench_depth(args) -> int:
    from training.bench.depth import (
        INITS,
        KNOWN_TASKS,
        DepthBenchSettings,
        bench_depth,
        depth_table,
        log_summary,
        plot_depth,
    )

    tasks = tuple(t for t in args.tasks.split(",") if t)
    inits = tuple(i for i in args.inits.split(",") if i)
    for flag, given, known in (("--tasks", tasks, KNOWN_TASKS), ("--inits", inits, INITS)):
        unknown = sorted(set(given) - set(known))
        if unknown or not given:
            raise ValueError(f"{flag}: unknown {', '.join(unknown) or 'nothing given'}; choose from {', '.join(known)}")
    if set(tasks) - {"level"} and not Path(args.data_dir).is_dir():
        raise FileNotFoundError(f"--data-dir {args.data_dir} does not exist (the shared data: ../shared/data)")
    settings = DepthBenchSettings(data_dir=args.data_dir, tasks=tasks, inits=inits,
                                  depths=tuple(_int_list(args.depths, "--depths")),
                                  seeds=tuple(_int_list(args.seeds, "--seeds", minimum=0)), steps=args.steps,
                                  lr=args.lr, warmup=args.warmup, batch_size=args.batch_size,
                                  tabfact_tables=args.tabfact_tables, bgl_lines=args.bgl_lines,
                                  hdfs_lines=args.hdfs_lines)
    out = Path(args.json)
    workdir = Path(args.workdir or out.with_suffix("")).resolve()
    result = bench_depth(settings, workdir, progress=not args.no_progress)
    _write_result(result, depth_table, out)
    pngs = plot_depth(result, out)
    log_summary(result, workdir, [out, out.with_suffix(".md"), *pngs])
    print(f"wrote {', '.join(map(str, pngs))}")
    return 0


def _require_paths(*given: tuple[str, str | None]) -> None:
    """Each (flag, path) given a path must exist: a user error in one line otherwise."""
    for flag, path in given:
        if path and not Path(path).exists():
            raise FileNotFoundError(f"{flag} {path} does not exist")


def cmd_bench_tables(args) -> int:
    from training.bench.tables import VARIANTS, TablesBenchSettings, bench_tables, plot_tables, tables_table

    variants = tuple(v for v in args.variants.split(",") if v)
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        raise ValueError(f"--variants: unknown {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    if args.jobs < 0:
        raise ValueError(f"--jobs {args.jobs}: give 0 (as many as torch's threads), 1 (one variant after the other) or more")
    _require_paths(("--tables", args.tables), ("--train", args.train), ("--test", args.test))
    settings = TablesBenchSettings(tables=args.tables, train=args.train, test=args.test, variants=variants,
                                   size=args.size, config=config_arg(args.config) if args.config else {},
                                   seed=args.seed, max_tables=args.max_tables, reuse_trained=args.reuse_trained,
                                   scaling_tokens=tuple(_int_list(args.scaling_tokens, "--scaling-tokens")),
                                   layer_positions=tuple(_int_list(args.layer_positions, "--layer-positions")),
                                   max_mb=args.max_mb, max_seconds=args.max_seconds, repeat=args.repeat,
                                   threads=args.threads, jobs=args.jobs)
    out = Path(args.json)
    workdir = Path(args.workdir or out.with_suffix(""))
    result = bench_tables(settings, workdir, progress=not args.no_progress, accuracy=not args.no_accuracy,
                          scaling=not args.no_scaling)
    _write_result(result, tables_table, out)
    for png in plot_tables(result, out):
        print(f"wrote {png}")
    return 0


def cmd_bench_table_lookup(args) -> int:
    from training.bench.lookup import write_lookup_statements

    _require_paths(("--tables", args.tables), ("--from", args.from_file))
    if args.per_table < 2 or args.max_rows < 2:
        raise ValueError("--per-table and --max-rows must be at least 2")
    counts = write_lookup_statements(args.tables, args.from_file, args.out, args.per_table, args.seed, args.max_rows,
                                     args.tables_out)
    print(f"wrote {args.out}: {json.dumps(counts)}")
    return 0


def add_bench_parser(sub) -> None:
    """The ``bench`` sub-commands, added to the CLI's sub-parsers."""
    bench = sub.add_parser("bench", help="benchmarks (JSON + Markdown table + plot)")
    bsub = bench.add_subparsers(dest="bench", required=True)
    bm = bsub.add_parser("model", help="TVM-KA vs flattened dense BERT (cut at the window as trained, and whole): "
                         "seconds and peak MB of one pass")
    bm.add_argument("--json", required=True, help="output JSON (a .md table and a .png plot go beside it)")
    bm.add_argument("--n-objects", default="50,300,1000,3000", help="comma-separated N")
    bm.add_argument("--n-keys", default="10,25,100", help="comma-separated K")
    bm.add_argument("--models", default="tvmka,flattened_truncated,flattened_full",
                    help="tvmka; flattened_truncated: most recent whole objects within --window tokens, as trained; "
                    "flattened_full: every object, no cut")
    bm.add_argument("--d-model", type=int, default=256)
    bm.add_argument("--n-layers", type=int, default=4)
    bm.add_argument("--n-heads", type=int, default=8)
    bm.add_argument("--n-shared-heads", type=int, default=4)
    bm.add_argument("--window", type=int, default=512,
                    help="TVM window and flattened_truncated's cut (max positions)")
    bm.add_argument("--tokens-per-value", type=int, default=3)
    bm.add_argument("--attn-backend", default="sdpa", choices=["sdpa", "eager"])
    bm.add_argument("--threads", type=int, default=0, help="torch threads per row (0 = default)")
    bm.add_argument("--max-mb", type=int, default=8192, help="memory budget per row; above it: oom")
    bm.add_argument("--max-seconds", type=float, default=300.0, help="time budget per row; above it: over_limit")
    bm.add_argument("--repeat", type=int, default=3, help="passes per row (up to 60 s); the fastest is reported")
    bm.add_argument("--no-progress", action="store_true")
    bm.set_defaults(func=cmd_bench_model)
    bp = bsub.add_parser("parse", help="Grouping Accuracy on LogHub-style folders, ours next to Drain3 defaults, "
                         "Drain3 with our masks and thresholds, and ours on the true Content")
    bp.add_argument("--loghub", required=True, action="append", metavar="DIR",
                    help="folder of <Name>/<Name>_2k.log(+_structured.csv) folders; repeat it for several roots")
    bp.add_argument("--json", required=True, help="output JSON (a .md table goes beside it)")
    bp.add_argument("--formats", default=None, metavar="JSON",
                    help="user log formats (parsers/presets.py: load_formats); a format named like a dataset "
                         "(lower-cased folder name) parses it before any preset")
    bp.add_argument("--auto-header", action="store_true",
                    help="also parse every dataset with a detected header (parsers/header_detect.py); it is the "
                         "headline GA of a dataset with neither format nor preset")
    bp.set_defaults(func=cmd_bench_parse)
    ba = bsub.add_parser("accuracy", help="every training mode and a count baseline on four datasets (five on request), same splits")
    ba.add_argument("--data", required=True, help="the shared data folder (hdfs_deeplog/, loghub/)")
    ba.add_argument("--json", required=True, help="output JSON (.md table, .png plot, .datasets.json beside it)")
    ba.add_argument("--datasets", default="hdfs,bgl,milestone,value_anomaly",
                    help="datasets (next_item too, on request: recall@k on generated purchase histories)")
    ba.add_argument("--modes", default="interleaved,no_interleave,flattened,record_view",
                    help="training modes (on request also joint, interleaved+surprise: scored with the masked-LM "
                         "surprise too; with interleaved as well, one training gives both rows; and "
                         "interleaved+rvd: with replaced-value detection; interleaved+bag: the TVM reads S(k) as a bag of "
                         "values, tvm_positions=within_value; interleaved+counts: the classifier also reads the hashed bag of values, "
                         "value_counts, the multiclass default); 'none': no training, the baselines only. count_lr "
                         "(event counts) and count_lr_values (every key=value pair S(k) reads) always run, and "
                         "always_positive (every sequence flagged: the floor) and count_pca on binary datasets")
    ba.add_argument("--size", default="demo", choices=["demo", "tiny"], help="model and step sizes")
    ba.add_argument("--limit", action="append", metavar="DATASET=N",
                    help="dataset size limit (hdfs: lines per file, default all; others: see training.bench.data)")
    ba.add_argument("--workdir", default=None, help="scratch folder (default: beside --json)")
    ba.add_argument("--config", default=None, metavar="JSON",
                    help='overrides for every run, inline JSON or a JSON file: {"model": {TVMKAConfig fields}, '
                    '"train": {TrainConfig fields}}')
    ba.add_argument("--seed", type=int, default=0)
    ba.add_argument("--seeds", default=None, metavar="S1,S2,...",
                    help="run everything once per seed and report the mean, std and per-seed rows (overrides --seed)")
    ba.add_argument("--split", default=None, choices=["by_content", "by_line"],
                    help="hdfs split: by_content (default; each distinct event sequence in one split only) or "
                         "by_line (the earlier split by line index, for comparison with papers; most test blocks "
                         "repeat a train block); only hdfs has these: an error with any other dataset")
    ba.add_argument("--no-progress", action="store_true")
    ba.set_defaults(func=cmd_bench_accuracy)

    bi = bsub.add_parser("ingest", help="ingest throughput on N generated HDFS-like lines vs a plain Drain3 loop, "
                         "without and with the ingest's masked-content cache")
    bi.add_argument("--lines", type=int, default=1_000_000)
    bi.add_argument("--json", required=True, help="output JSON (a .md table goes beside it)")
    bi.add_argument("--seed", type=int, default=0)
    bi.add_argument("--workers", default=None, metavar="W1,W2,...",
                    help="also ingest the lines cut into files with parallel workers (parsers.parallel_ingest), "
                         "once per count, next to the serial ingest of the same files: the 'parallel' rows")
    bi.add_argument("--files", type=int, default=None,
                    help="files the lines are cut into for --workers (default 4 per worker of the largest count)")
    bi.add_argument("--executor", choices=EXECUTORS, default="process",
                    help="who runs the --workers rows: worker processes (default), or also the seqenc_ingest DAG "
                         "on a local Celery cluster of that many workers (needs redis-server and PostgreSQL): "
                         "rows with executor 'celery'")
    bi.add_argument("--no-loops", action="store_true",
                    help="leave out the Drain3 loop baselines (the uncached one is slow on millions of lines)")
    bi.set_defaults(func=cmd_bench_ingest)
    bs = bsub.add_parser("score", help="batch-scoring throughput of a d_model-256 4-layer TVM-KA (random init) on "
                         "generated HDFS blocks vs scoring one sequence at a time")
    bs.add_argument("--json", required=True, help="output JSON (a .md table goes beside it)")
    bs.add_argument("--sequences", type=int, default=1000, help="HDFS blocks generated and batch-scored")
    bs.add_argument("--baseline-sequences", type=int, default=100,
                    help="of those, how many the one-at-a-time baseline scores (0: no baseline)")
    bs.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    bs.add_argument("--chunk-sequences", type=int, default=None,
                    help="sequences scored per chunk on the product path (default 2000, as seqenc score)")
    bs.add_argument("--small-chunk", type=int, default=None,
                    help="sequences per chunk of the side that checks chunking changes no score (default 100; 0: "
                         "leave that side out)")
    for flag, default in (("--d-model", 256), ("--n-layers", 4), ("--n-heads", 8), ("--n-shared-heads", 4),
                          ("--d-ff", 1024)):
        bs.add_argument(flag, type=int, default=None, help=f"model size (default {default})")
    bs.add_argument("--seed", type=int, default=0)
    bs.add_argument("--workdir", default=None, help="scratch folder: data, bundle, predictions (default: beside --json)")
    bs.add_argument("--no-progress", action="store_true")
    bs.set_defaults(func=cmd_bench_score)
    br = bsub.add_parser("train", help="a training job (hdfs anomaly) on 1 data-parallel rank and on N (DeepSpeed, "
                         "gloo on CPU): key rows each rank refreshes, refresh and trainer seconds, ratios")
    br.add_argument("--json", required=True, help="output JSON (a .md table and a .png plot go beside it)")
    br.add_argument("--size", default="tiny", help="built-in size of the data, model and training (default tiny)")
    br.add_argument("--worlds", default="1,2", metavar="1,N,...", help="world sizes to run, 1 included")
    br.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of each rank")
    br.add_argument("--config", default=None, metavar="JSON", help="train overrides, as seqenc train --config")
    br.add_argument("--deepspeed", default=None, metavar="JSON", help="DeepSpeed config (default ZeRO stage 0)")
    br.add_argument("--seed", type=int, default=0)
    br.add_argument("--workdir", default=None, help="data and jobs (default: beside --json)")
    br.set_defaults(func=cmd_bench_train)
    bq = bsub.add_parser("sequences", help="value-sequence building over days of generated, ingested logs: in "
                         "buckets (the product path) vs one in-memory pass, peak RSS and seconds each")
    bq.add_argument("--json", required=True, help="output JSON (a .md table and a .png plot go beside it)")
    bq.add_argument("--days", type=int, default=2, help="days of logs, each its own ingest partition")
    bq.add_argument("--lines-per-day", type=int, default=200_000)
    bq.add_argument("--chunk-sequences", default="20000", metavar="N1,N2,...",
                    help="sequences per bucket of the product path, one 'all' row each (default 20000)")
    bq.add_argument("--compare-sequences", type=int, default=20_000,
                    help="a sample this large is built both in memory and in buckets, files compared (0: skip)")
    bq.add_argument("--seed", type=int, default=0)
    bq.add_argument("--workdir", default=None,
                    help="data and outputs (default: beside --json); days already ingested there are reused")
    bq.add_argument("--no-progress", action="store_true")
    bq.set_defaults(func=cmd_bench_sequences)
    bd = bsub.add_parser("depth", help="KA depth x init (default + warm-up, default, DT-Fixup) over a frozen MiniLM "
                         "TVM on TabFact, BGL and HDFS: test metric and final train loss per cell, learning curves")
    bd.add_argument("--json", required=True, help="output JSON (a .md table and a -curves.png plot go beside it)")
    bd.add_argument("--data-dir", default=str(Path(__file__).resolve().parents[3] / "shared" / "data"),
                    help="the shared data (tabfact/, loghub/, hdfs_deeplog/)")
    bd.add_argument("--tasks", default="tabfact,bgl,hdfs",
                    help="tabfact, bgl, hdfs (../shared/data), level (synthetic: the 16-layer test's tiny task)")
    bd.add_argument("--depths", default="2,4,8,16", metavar="N1,N2,...")
    bd.add_argument("--inits", default="default_warmup,default,dt_fixup")
    bd.add_argument("--seeds", default="0,1,2", metavar="S1,S2,...")
    bd.add_argument("--steps", type=positive_int, default=300, help="KA steps per cell")
    bd.add_argument("--lr", type=float, default=5e-4, help="the KA's learning rate, every cell")
    bd.add_argument("--warmup", type=int, default=50, help="warm-up steps of default_warmup")
    bd.add_argument("--batch-size", type=positive_int, default=32)
    bd.add_argument("--tabfact-tables", type=positive_int, default=None, help="a seeded sample of TabFact's tables")
    bd.add_argument("--bgl-lines", type=positive_int, default=200_000, help="BGL log lines read")
    bd.add_argument("--hdfs-lines", type=positive_int, default=None,
                    help="lines kept of each HDFS file (default: all)")
    bd.add_argument("--workdir", default=None, help="data, MLflow store (default: beside --json)")
    bd.add_argument("--no-progress", action="store_true")
    bd.set_defaults(func=cmd_bench_depth)

    bt = bsub.add_parser("tables", help="table-text verification in TabFact's layout: dense, MATE, TableFormer and "
                         "TVM-KA (scratch, MiniLM) next to majority, bag-of-words and word-overlap baselines, accuracy under row / "
                         "column shuffles, and forward+backward time and memory from 512 to 8192 tokens")
    bt.add_argument("--tables", required=True, help="folder of #-separated tables (header first)")
    bt.add_argument("--train", required=True, help="JSON Lines statements: table, statement, label")
    bt.add_argument("--test", default=None, help="JSON Lines statements to test on: every row is scored on them, "
                    "and --train is split into train and dev by table only (default: --train's own test split)")
    bt.add_argument("--json", required=True, help="output JSON (a .md table and .png plots go beside it)")
    bt.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                    help="comma-separated (default: %(default)s); also dense, tableformer, mafid, tvmka_minilm; MAFiD's ablations mafid_no_ema, mafid_full_ema, mafid_no_gate; "
                    "any table variant + _minilm (e.g. mafid_minilm): initialised from MiniLM; any of those + _wide "
                    "(e.g. mate_wide): its classifier also reads checks_lr's features (word overlap, row matches, checks)")
    bt.add_argument("--size", default="demo", choices=["demo", "tiny"], help="model and step sizes")
    bt.add_argument("--config", default=None, help='overrides: {"model": {...}, "train": {...}, "variants": '
                    '{"tvmka_minilm": {"train": {...}}}} (JSON or a file)')
    bt.add_argument("--seed", type=int, default=0)
    bt.add_argument("--max-tables", type=int, default=None, help="a seeded sample of the train file's tables")
    bt.add_argument("--scaling-tokens", default="512,1024,2048,4096,8192", metavar="N1,N2,...")
    bt.add_argument("--layer-positions", default="1024,4096,16384,65536", metavar="N1,N2,...",
                    help="positions of the ema_lowdim vs attention layer rows")
    bt.add_argument("--max-mb", type=int, default=8192, help="a scaling child past this resident size: oom")
    bt.add_argument("--max-seconds", type=float, default=300.0, help="a scaling child past this: over_limit")
    bt.add_argument("--repeat", type=int, default=2, help="timed passes per scaling row (after a warm-up)")
    bt.add_argument("--threads", type=int, default=2, help="torch threads of a scaling child")
    bt.add_argument("--jobs", type=int, default=0, help="variants trained at once, each in its own process "
                    "with its share of torch's threads (default 0: as many as torch's threads, i.e. OMP_NUM_THREADS "
                    "or the cores; 1: one after the other)")
    bt.add_argument("--no-accuracy", action="store_true", help="only the scaling rows")
    bt.add_argument("--reuse-trained", action="store_true", help="variants an earlier run trained to the end in "
                    "--workdir are scored again, not retrained (an interrupted bench goes on where it stopped)")
    bt.add_argument("--no-scaling", action="store_true", help="only the accuracy rows")
    bt.add_argument("--workdir", default=None, help="data, models, MLflow store (default: beside --json)")
    bt.add_argument("--no-progress", action="store_true")
    bt.set_defaults(func=cmd_bench_tables)

    bl = bsub.add_parser("table-lookup", help="cell-lookup statements ('the <column> of <key> is <value>', half "
                         "with another row's value) over real tables, in TabFact's layout, for bench tables --train")
    bl.add_argument("--tables", required=True, help="folder of #-separated tables (header first)")
    bl.add_argument("--from", dest="from_file", required=True, help="JSON Lines naming the tables (a 'table' field)")
    bl.add_argument("--out", required=True, help="output JSON Lines: table, statement, label, caption")
    bl.add_argument("--per-table", type=int, default=8, help="statements a table (half true)")
    bl.add_argument("--max-rows", type=int, default=8, help="statements name only the first N data rows")
    bl.add_argument("--tables-out", default=None, help="also write each used table cut to its header and first "
                    "--max-rows rows here (pass it as bench tables --tables)")
    bl.add_argument("--seed", type=int, default=0)
    bl.set_defaults(func=cmd_bench_table_lookup)
