"""Template-parsing quality: Grouping Accuracy (GA) and ``seqenc bench parse``.

GA (Zhu et al., "Tools and Benchmarks for Automated Log Parsing", ICSE-SEIP 2019; defined in
../shared/data/README.md): a line is parsed correctly when the set of lines sharing its
predicted group equals the set of lines sharing its true template; GA = correct lines / lines.

``bench_parse`` runs, for every LogHub-style folder (``<Name>_2k.log`` + ``<Name>_2k.log_structured.csv``):

* **ours**: the raw lines through the same code path as ingestion -- the preset's header regex,
  its masks, Drain3 with its depth / similarity (:class:`parsers.logs.LineParser`); a line
  whose header does not match is a group of its own (it would be a reject);
* **Drain3 defaults**: ``TemplateMiner()`` with no configuration, fed the ground-truth
  ``Content`` column (so it is not penalised for header parsing).

The preset is picked by the folder name (``HDFS`` -> ``hdfs``); nothing reads the ground-truth
templates except the scorer.
"""

from __future__ import annotations

import csv
import json
import logging
from collections import Counter, defaultdict
from collections.abc import Hashable, Sequence
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

log = logging.getLogger(__name__)

PUBLISHED_DRAIN_GA = {"HDFS": 0.998, "Hadoop": 0.948, "Spark": 0.920, "Zookeeper": 0.967, "BGL": 0.963,
                      "HPC": 0.887, "Linux": 0.690, "OpenStack": 0.733}


def _round3(x: float) -> float:
    return float(Decimal(str(x)).quantize(Decimal("0.001"), rounding=ROUND_HALF_UP))


def grouping_accuracy(truth: Sequence[Hashable], predicted: Sequence[Hashable]) -> float:
    """Share of lines whose predicted group holds exactly the lines of their true group."""
    if len(truth) != len(predicted):
        raise ValueError(f"{len(truth)} true labels but {len(predicted)} predictions")
    if not truth:
        return 0.0
    true_size = Counter(truth)
    members: dict[Hashable, list[Hashable]] = defaultdict(list)
    for t, p in zip(truth, predicted):
        members[p].append(t)
    correct = 0
    for labels in members.values():
        if len(set(labels)) == 1 and true_size[labels[0]] == len(labels):
            correct += len(labels)
    return correct / len(truth)


def read_loghub_folder(folder: Path) -> tuple[str, list[str], list[str], list[str]]:
    """(name, raw lines, ground-truth event ids, ground-truth contents) of one LogHub folder."""
    structured = sorted(folder.glob("*_2k.log_structured.csv"))
    raw = sorted(folder.glob("*_2k.log"))
    if not structured or not raw:
        raise FileNotFoundError(f"{folder}: needs <Name>_2k.log and <Name>_2k.log_structured.csv")
    name = raw[0].name.removesuffix("_2k.log")
    with structured[0].open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    lines = raw[0].read_text(encoding="utf-8", errors="replace").splitlines()
    lines = [ln for ln in lines if ln.strip()]
    if len(lines) != len(rows):
        raise ValueError(f"{folder}: {len(lines)} raw lines but {len(rows)} structured rows")
    return name, lines, [r["EventId"] for r in rows], [r["Content"] for r in rows]


def our_groups(lines: list[str], preset: str) -> list[Hashable]:
    """Predicted group of every raw line through the ingestion parser (no state on disk)."""
    from parsers.logs import LineParser

    parser = LineParser(preset, state_path=None)
    groups: list[Hashable] = []
    for i, line in enumerate(lines):
        parsed = parser.parse(line)
        groups.append(("reject", i) if isinstance(parsed, str) else parsed.cluster.cluster_id)
    return groups


def drain3_default_groups(contents: list[str]) -> list[Hashable]:
    from drain3 import TemplateMiner

    miner = TemplateMiner()
    return [miner.add_log_message(c)["cluster_id"] for c in contents]


def bench_parse(loghub_dir: str | Path, presets: dict[str, str] | None = None) -> dict:
    """GA of our parser and of default Drain3 on every LogHub folder under ``loghub_dir``."""
    from parsers.presets import PRESETS

    root = Path(loghub_dir)
    folders = sorted(p for p in root.iterdir() if p.is_dir() and list(p.glob("*_2k.log")))
    if not folders:
        raise FileNotFoundError(f"no LogHub folders (with <Name>_2k.log) under {root}")
    datasets = {}
    for folder in folders:
        name, lines, truth, contents = read_loghub_folder(folder)
        preset = (presets or {}).get(name, name.lower())
        if preset not in PRESETS:
            log.warning("%s: no preset named %r, skipped", name, preset)
            continue
        ours = our_groups(lines, preset)
        datasets[name] = {
            "lines": len(lines),
            "ga": round(grouping_accuracy(truth, ours), 4),
            "ga_drain3_default": round(grouping_accuracy(truth, drain3_default_groups(contents)), 4),
            "preset": preset,
            "groups": len(set(ours)),
            "true_groups": len(set(truth)),
            "header_rejects": sum(1 for g in ours if isinstance(g, tuple)),
            "published_drain_ga": PUBLISHED_DRAIN_GA.get(name),
        }
        log.info("%s: %s", name, datasets[name])
    n = len(datasets)
    return {
        "datasets": datasets,
        "mean_ga": round(sum(d["ga"] for d in datasets.values()) / n, 4),
        "mean_ga_drain3_default": round(sum(d["ga_drain3_default"] for d in datasets.values()) / n, 4),
        # published GAs have 3 decimals (rounded half up): compare at that precision
        "below_published_drain": sorted(name for name, d in datasets.items() if d["published_drain_ga"] is not None
                                        and _round3(d["ga"]) < d["published_drain_ga"]),
    }


def parse_table(result: dict) -> str:
    lines = ["| dataset | lines | GA (seqenc) | GA (Drain3 defaults) | published Drain | groups / true |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, d in result["datasets"].items():
        pub = "" if d["published_drain_ga"] is None else f"{d['published_drain_ga']:.3f}"
        lines.append(f"| {name} | {d['lines']} | {d['ga']:.3f} | {d['ga_drain3_default']:.3f} | {pub} | "
                     f"{d['groups']} / {d['true_groups']} |")
    lines.append(f"| **mean** | | **{result['mean_ga']:.3f}** | {result['mean_ga_drain3_default']:.3f} | | |")
    return "\n".join(lines)


def write_parse_outputs(result: dict, json_path: str | Path) -> list[Path]:
    json_path = Path(json_path)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(result, indent=2))
    md = json_path.with_suffix(".md")
    md.write_text(parse_table(result) + "\n")
    return [json_path, md]
