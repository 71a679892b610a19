"""Template-parsing quality: Grouping Accuracy (GA) and ``seqenc bench parse``.

GA (Zhu et al., "Tools and Benchmarks for Automated Log Parsing", ICSE-SEIP 2019; defined in
../shared/data/README.md): a line is parsed correctly when the set of lines sharing its
predicted group equals the set of lines sharing its true template; GA = correct lines / lines.

``bench_parse`` runs four parsers on every LogHub-style folder (``<Name>_2k.log`` +
``<Name>_2k.log_structured.csv``). Read top to bottom, each row adds one thing, so the
differences say where our GA comes from:

* ``ga_drain3_default``: ``TemplateMiner()`` with no configuration (no masks, depth 4,
  similarity 0.4), fed the ground-truth ``Content`` column (not penalised for header parsing);
* ``ga_drain3_same_masks``: Drain3's own ``TemplateMiner`` and plain Drain3 ``Drain`` with the
  preset's masks, depth, similarity threshold and extra delimiters (the configuration of
  :func:`parsers.logs.make_miner`), same ground-truth ``Content``; the gap to the row above is
  what the preset's *settings* buy;
* ``ga_same_parser_true_content``: our parser -- the same settings plus the mask-aware
  similarity (:class:`parsers.drain.MaskAwareDrain`) and the masked-content cache of
  :class:`parsers.logs.LineParser` -- on the same ground-truth ``Content``; the gap to the row
  above is what the *similarity* buys;
* ``ga``: our parser on the raw lines, as ingestion runs it (the preset's header regex splits
  off ``Content``; a line whose header does not match is a group of its own: a reject); the gap
  to the row above is what our *header split* costs or buys.

The preset is picked by the folder name (``HDFS`` -> ``hdfs``); nothing reads the ground-truth
templates except the scorer.

**How the presets' settings were chosen: on these same files (in-sample).** The GA rows other
than the Drain3 defaults are not held-out figures. Eight of the eleven presets take their
settings from the LogPAI Drain benchmark (``logparser/Drain/benchmark.py`` in logpai/logparser),
whose per-dataset regexes, similarity thresholds and depths were set for, and are run on, these
very ``loghub_2k`` files; the three that differ (HDFS, HPC, OpenStack) were written in this
project while GA on these files was the target (issue 4: mean GA >= 0.90, no set below
published Drain). They landed in one commit with this bench (6fc5826), so the history does not
show how they were arrived at; no other data was used. Per preset (``SETTINGS_ORIGIN``, also
in the JSON as ``settings_origin``):

* Hadoop, Spark, Zookeeper, BGL, Linux (and Thunderbird, Apache, which have no shared data;
  syslog reuses Linux's): LogPAI's regexes (written with token boundaries, IPs with an optional
  port), ``st`` and depth unchanged;
* HDFS: our generic default masks (paths, block ids -- a list of them as one value --, IPs with
  ports, UUIDs, hex, numbers), a superset of LogPAI's two (block id, IP); ``st`` 0.5, depth 4
  as LogPAI;
* HPC: every number masked (LogPAI masks only numbers after ``=``); first written as LogPAI's
  ``=\\d+`` plus every number, the look-behind dropped in 2f93993 (masks must read the same in
  Python's and polars' regex); ``st`` 0.5, depth 4 as LogPAI;
* OpenStack: LogPAI's three regexes (IP lists, paths, numbers) with token boundaries (the path
  mask stops at whitespace instead of eating it, numbers only as whole tokens); ``st`` 0.5,
  depth 5 as LogPAI.

**Why GA equals published Drain exactly on five sets.** Where the settings are LogPAI's
(Hadoop, Spark, Zookeeper, BGL, Linux), our parser runs LogPAI's Drain recipe on LogPAI's
input: LogPAI's Drain replaces a masked value by ``<*>``, which its similarity skips, and
``MaskAwareDrain`` skips masked tokens the same way; same masks, same thresholds, same files,
so it reproduces the published GA (3 decimals, rounded half up). The three sets above published Drain
(HDFS, HPC, OpenStack) are exactly the three with settings of our own. Measured (2026-11,
issue 21): on those five sets plain Drain3 with the same masks gives the same GA as ours too,
and on every set the header split changes nothing (``ga`` == ``ga_same_parser_true_content``);
of the mean's 0.818 -> 0.910, the settings give 0.818 -> 0.899 and the mask-aware similarity
0.899 -> 0.910 (HPC 0.887 -> 0.932, OpenStack 0.818 -> 0.860).
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

SETTINGS_CHOSEN_ON = ("the same LogHub 2k files (in-sample): LogPAI's Drain benchmark settings for these files, "
                      "and our own for HDFS, HPC and OpenStack, written with GA on these files as the target")
_LOGPAI = "LogPAI Drain benchmark settings for these files, unchanged (regexes, st 0.5, depth 4)"
SETTINGS_ORIGIN = {  # how each preset's masks and thresholds were chosen (see the module docstring)
    "hdfs": "own: generic default masks (path, block ids, IP:port, UUID, hex, number), a superset of LogPAI's "
            "block id + IP; st 0.5, depth 4 as LogPAI",
    "hadoop": _LOGPAI,
    "spark": _LOGPAI,
    "zookeeper": _LOGPAI,
    "bgl": _LOGPAI,
    "hpc": "own: every number masked (LogPAI: only numbers after '='); st 0.5, depth 4 as LogPAI",
    "linux": "LogPAI Drain benchmark settings for these files, unchanged (IP, clock masks, st 0.39, depth 6)",
    "syslog": "Linux's (LogPAI's Linux settings)",
    "thunderbird": _LOGPAI,
    "apache": _LOGPAI,
    "openstack": "own variant of LogPAI's three regexes (IP lists, paths, numbers) with token boundaries; "
                 "st 0.5, depth 5 as LogPAI",
}


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
    """Drain3 as it comes: ``TemplateMiner()``, no masks, its default depth and similarity."""
    from drain3 import TemplateMiner

    miner = TemplateMiner()
    return [miner.add_log_message(c)["cluster_id"] for c in contents]


def drain3_same_masks_groups(contents: list[str], preset: str) -> list[Hashable]:
    """Drain3's own ``TemplateMiner`` with the preset's masks, depth, similarity threshold and
    extra delimiters, and Drain3's plain ``Drain`` (a masked token is an ordinary word).

    Choice: the miner is built by :func:`parsers.logs.make_miner` (so the settings are the
    parser's by construction) and its ``Drain`` is switched back from ``MaskAwareDrain``, which
    only overrides the similarity."""
    from drain3.drain import Drain

    from parsers.logs import make_miner
    from parsers.presets import PRESETS

    miner = make_miner(PRESETS[preset], None)
    miner.drain.__class__ = Drain
    return [miner.add_log_message(c)["cluster_id"] for c in contents]


def same_parser_true_content_groups(contents: list[str], preset: str) -> list[Hashable]:
    """Our parser (masks, settings, mask-aware similarity, masked-content cache: ``LineParser``)
    on the ground-truth contents: the preset with its header replaced by ``<Content>``."""
    from dataclasses import replace

    from parsers.logs import LineParser
    from parsers.presets import PRESETS

    content_only = replace(PRESETS[preset], header="<Content>", header_regex=None, ts_fields=(), ts_format=None)
    parser = LineParser(content_only, state_path=None)
    return [parser.parse(c).cluster.cluster_id for c in contents]


def bench_parse(loghub_dir: str | Path, presets: dict[str, str] | None = None) -> dict:
    """GA of our parser and of the three baselines (module docstring) on every LogHub folder
    under ``loghub_dir``."""
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
            "ga_drain3_same_masks": round(grouping_accuracy(truth, drain3_same_masks_groups(contents, preset)), 4),
            "ga_same_parser_true_content": round(
                grouping_accuracy(truth, same_parser_true_content_groups(contents, preset)), 4),
            "preset": preset,
            "settings_origin": SETTINGS_ORIGIN[preset],
            "groups": len(set(ours)),
            "true_groups": len(set(truth)),
            "header_rejects": sum(1 for g in ours if isinstance(g, tuple)),
            "published_drain_ga": PUBLISHED_DRAIN_GA.get(name),
        }
        log.info("%s: %s", name, datasets[name])
    def mean(field: str) -> float:
        return round(sum(d[field] for d in datasets.values()) / len(datasets), 4)

    return {
        "datasets": datasets,
        "mean_ga": mean("ga"),
        "mean_ga_drain3_default": mean("ga_drain3_default"),
        "mean_ga_drain3_same_masks": mean("ga_drain3_same_masks"),
        "mean_ga_same_parser_true_content": mean("ga_same_parser_true_content"),
        "settings_chosen_on": SETTINGS_CHOSEN_ON,
        # published GAs have 3 decimals (rounded half up): compare at that precision
        "below_published_drain": sorted(name for name, d in datasets.items() if d["published_drain_ga"] is not None
                                        and _round3(d["ga"]) < d["published_drain_ga"]),
    }


def parse_table(result: dict) -> str:
    """Markdown: one row a dataset, the GA columns in the order of the module docstring."""
    lines = ["| dataset | lines | Drain3 defaults | Drain3 + our masks & thresholds | ours on true Content "
             "| **ours (raw lines)** | published Drain | groups / true |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, d in result["datasets"].items():
        pub = "" if d["published_drain_ga"] is None else f"{d['published_drain_ga']:.3f}"
        lines.append(f"| {name} | {d['lines']} | {d['ga_drain3_default']:.3f} | {d['ga_drain3_same_masks']:.3f} | "
                     f"{d['ga_same_parser_true_content']:.3f} | **{d['ga']:.3f}** | {pub} | "
                     f"{d['groups']} / {d['true_groups']} |")
    lines.append(f"| **mean** | | {result['mean_ga_drain3_default']:.3f} | {result['mean_ga_drain3_same_masks']:.3f} | "
                 f"{result['mean_ga_same_parser_true_content']:.3f} | **{result['mean_ga']:.3f}** | | |")
    lines.append("")
    lines.append(f"Settings chosen on: {result['settings_chosen_on']}.")
    return "\n".join(lines)


def write_parse_outputs(result: dict, json_path: str | Path) -> list[Path]:
    json_path = Path(json_path)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(result, indent=2))
    md = json_path.with_suffix(".md")
    md.write_text(parse_table(result) + "\n")
    return [json_path, md]
