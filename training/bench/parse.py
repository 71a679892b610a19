"""Template-parsing quality: Grouping Accuracy (GA) and ``seqenc bench parse``.

GA (Zhu et al., "Tools and Benchmarks for Automated Log Parsing", ICSE-SEIP 2019; defined in
../shared/data/README.md): a line is parsed correctly when the set of lines sharing its
predicted group equals the set of lines sharing its true template; GA = correct lines / lines.

Parsing Accuracy (PA, LogHub-2.0): the share of lines whose template text equals the true one
(:func:`parsing_accuracy`, both through :func:`normalize_template`).

Each dataset is parsed in every way it has (``VARIANTS``): a format of ``--formats`` named like
it, its preset, a header detected from its lines (``--auto-header``, parsers.header_detect);
``ga_<way>`` / ``pa_<way>`` each, and the headline ``ga`` / ``pa`` from the first (docs/data-layout.md).
For a dataset with a preset, ``bench_parse`` also runs three baselines on every LogHub-style
folder (``<Name>_2k.log`` + ``<Name>_2k.log_structured.csv``). Read top to bottom, each row
adds one thing, so the differences say where our GA comes from:

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
* ``ga_preset`` (the headline ``ga`` when no format is given): our parser on the raw lines, as
  ingestion runs it (the preset's header regex splits off ``Content``; a line whose header does
  not match is a group of its own: a reject); the gap to the row above is what our *header
  split* costs or buys.

The preset is picked by the folder name (``HDFS`` -> ``hdfs``); nothing reads the ground-truth
templates except the scorer. ``--loghub`` may be given several times (``../shared/data/loghub``
and ``loghub-more``: twelve systems); a dataset parsed with the default settings (a header-only
format or a detected header) also gets ``ga_loso``, its GA under the setting chosen without it
(training.bench.parse_loso), and the top level ``mean_ga_loso`` and ``loso``.

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
import re
from collections import Counter, defaultdict
from collections.abc import Hashable, Sequence
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

log = logging.getLogger(__name__)

PUBLISHED_DRAIN_GA = {"HDFS": 0.998, "Hadoop": 0.948, "Spark": 0.920, "Zookeeper": 0.967, "BGL": 0.963,
                      "HPC": 0.887, "Linux": 0.690, "OpenStack": 0.733,
                      # ../shared/data/loghub-more (Drain tuned per system, as the eight above)
                      "Android": 0.911, "HealthApp": 0.780, "Mac": 0.787, "OpenSSH": 0.788}

SETTINGS_CHOSEN_ON = ("the same LogHub 2k files (in-sample): LogPAI's Drain benchmark settings for these files, "
                      "and our own for HDFS, HPC and OpenStack, written with GA on these files as the target")
DEFAULT_MASKS_CHOSEN_ON = ("the twelve shared LogHub 2k files (loghub/: BGL, HDFS, HPC, Hadoop, Linux, OpenStack, "
                           "Spark, Zookeeper, issue 23; loghub-more/: Android, HealthApp, Mac, OpenSSH, issue 49) with "
                           "header-only formats; mask_shapes, split_words, sim_th and depth by leave-one-system-out "
                           "GA over that grid (training/bench/parse_loso.py); no other system informed them")
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


def read_loghub(folder: Path) -> dict:
    """One LogHub folder: ``name``, raw ``lines``, ground-truth ``event_ids``, ``contents`` and
    ``templates`` (read by the scorers only)."""
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
    return {"name": name, "lines": lines, "event_ids": [r["EventId"] for r in rows],
            "contents": [r["Content"] for r in rows], "templates": [r["EventTemplate"] for r in rows]}


def read_loghub_folder(folder: Path) -> tuple[str, list[str], list[str], list[str]]:
    """(name, raw lines, ground-truth event ids, ground-truth contents) of one LogHub folder."""
    d = read_loghub(folder)
    return d["name"], d["lines"], d["event_ids"], d["contents"]


def our_parse(lines: list[str], fmt) -> tuple[list[Hashable], list[str | None]]:
    """Predicted group and final template of every raw line through the ingestion parser (no
    state on disk); ``fmt`` a preset name or a LogFormat. As ingest does: every line through
    Drain3 first, then each distinct content's event (its template, or a word-split event:
    parsers.word_split). A line whose header does not match is a group of its own (a reject)
    with no template."""
    from parsers.logs import LineParser, events_of

    parser = LineParser(fmt, state_path=None)
    parsed = [parser.parse(line) for line in lines]
    contents: dict[str, object] = {}
    for p in parsed:
        if not isinstance(p, str):
            contents.setdefault(p.masked, p.cluster)
    events = events_of(parser.miner, contents)  # templates as they end
    groups: list[Hashable] = [("reject", i) if isinstance(p, str) else events[p.masked][0] for i, p in enumerate(parsed)]
    return groups, [None if isinstance(p, str) else events[p.masked][1] for p in parsed]


_MASK_TOKEN = re.compile(r"<[A-Z][A-Z0-9_]*>|<\*>")
_JOINED_WILDCARDS = re.compile(r"<\*>(?:[.:,_-]?<\*>)+")


def normalize_template(template: str) -> str:
    """A template as Parsing Accuracy compares it: every mask token (``<IP>``, ``<NUM>``) and
    Drain's ``<*>`` as ``<*>``; wildcards joined by nothing or by one of ``. : , _ -`` as one
    (``<*>.<*>`` -> ``<*>``: a masked ``0.52`` against LogHub's ``<*>.<*>``, as LogHub-2.0's
    template corrections do); whitespace runs as one space."""
    out = _MASK_TOKEN.sub("<*>", template)
    out = _JOINED_WILDCARDS.sub("<*>", out)
    return re.sub(r"\s+", " ", out).strip()


def parsing_accuracy(true_templates: Sequence[str], predicted: Sequence[str | None]) -> float:
    """PA (LogHub-2.0): the share of lines whose predicted template text equals the true one,
    both through :func:`normalize_template` (a line without a template is wrong)."""
    if len(true_templates) != len(predicted):
        raise ValueError(f"{len(true_templates)} true templates but {len(predicted)} predictions")
    if not true_templates:
        return 0.0
    right = sum(1 for t, p in zip(true_templates, predicted)
                if p is not None and normalize_template(t) == normalize_template(p))
    return right / len(true_templates)


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


VARIANTS = ("format", "preset", "auto")  # what parses a dataset, in order of precedence


def _variants(name: str, lines: list[str], presets: dict[str, str] | None, formats: dict, auto_header: bool) -> dict:
    """``{variant: (label, LogFormat or preset name)}`` for one dataset: a ``--formats`` format
    named like it (lower-cased), its preset, and with ``auto_header`` a detected header."""
    from parsers.header_detect import suggest_header
    from parsers.presets import PRESETS

    key = name.lower()
    out = {}
    if key in formats:
        out["format"] = (key, formats[key])
    preset = (presets or {}).get(name, key)
    if preset in PRESETS:
        out["preset"] = (preset, preset)
    if auto_header:
        suggestion = suggest_header(lines)
        out["auto"] = (suggestion.header, suggestion.log_format(key))
    return out


def loghub_folders(roots: str | Path | Sequence[str | Path]) -> list[Path]:
    """The LogHub folders (``<Name>_2k.log`` inside) under one root or several, by name; a name
    found under two roots is an error (the same system twice would count twice)."""
    roots = [roots] if isinstance(roots, str | Path) else list(roots)
    folders: dict[str, Path] = {}
    for root in map(Path, roots):
        if not root.is_dir():
            raise FileNotFoundError(f"no such folder: {root}")
        found = sorted(p for p in root.iterdir() if p.is_dir() and list(p.glob("*_2k.log")))
        if not found:
            raise FileNotFoundError(f"no LogHub folders (with <Name>_2k.log) under {root}")
        for p in found:
            if p.name in folders:
                raise ValueError(f"{p.name} is under two roots ({folders[p.name].parent}, {root}); give each system once")
            folders[p.name] = p
    return [folders[n] for n in sorted(folders)]


def bench_parse(loghub_dir: str | Path | Sequence[str | Path], presets: dict[str, str] | None = None,
                formats_file: str | Path | None = None, auto_header: bool = False, loso: bool = True) -> dict:
    """GA and PA of our parser, and the baselines of the module docstring, on every LogHub
    folder under ``loghub_dir``. Each dataset is parsed by every variant it has (``VARIANTS``:
    a format of ``formats_file`` named like it, its preset, a detected header with
    ``auto_header``: ``ga_<variant>``, ``pa_<variant>``); ``ga`` / ``pa`` are the first of them
    (a given format before the preset before detection, as ingest chooses), named by
    ``format`` (its name, or ``"auto"``) or ``preset``. A dataset with none is skipped."""
    from parsers.presets import load_formats

    formats = load_formats(formats_file) if formats_file else {}
    folders = loghub_folders(loghub_dir)
    datasets, defaults_parsed = {}, {}
    for folder in folders:
        data = read_loghub(folder)
        name, lines, truth, contents = data["name"], data["lines"], data["event_ids"], data["contents"]
        variants = _variants(name, lines, presets, formats, auto_header)
        if not variants:
            log.warning("%s: no format named %r, no preset, no --auto-header: skipped", name, name.lower())
            continue
        row: dict = {"lines": len(lines)}
        primary = None
        for variant in VARIANTS:
            if variant not in variants:
                continue
            label, fmt = variants[variant]
            groups, templates = our_parse(lines, fmt)
            row[f"ga_{variant}"] = round(grouping_accuracy(truth, groups), 4)
            row[f"pa_{variant}"] = round(parsing_accuracy(data["templates"], templates), 4)
            if variant == "auto":
                row["auto_header"] = label
            if primary is None:
                primary = variant
                row |= {"ga": row[f"ga_{variant}"], "pa": row[f"pa_{variant}"], "parsed_with": variant,
                        "groups": len(set(groups)), "true_groups": len(set(truth)),
                        "header_rejects": sum(1 for g in groups if isinstance(g, tuple))}
                row |= {"preset": label} if variant == "preset" else {"format": "auto" if variant == "auto" else label}
                if variant != "preset":  # parsed with the default settings: in the leave-one-out
                    defaults_parsed[name] = (lines, truth, fmt)
        row["ga_drain3_default"] = round(grouping_accuracy(truth, drain3_default_groups(contents)), 4)
        if "preset" in variants:  # the like-for-like rows need the preset's settings
            preset = variants["preset"][0]
            row["ga_drain3_same_masks"] = round(grouping_accuracy(truth, drain3_same_masks_groups(contents, preset)), 4)
            row["ga_same_parser_true_content"] = round(
                grouping_accuracy(truth, same_parser_true_content_groups(contents, preset)), 4)
            row["settings_origin"] = SETTINGS_ORIGIN[preset]
        row["published_drain_ga"] = PUBLISHED_DRAIN_GA.get(name)
        datasets[name] = row
        log.info("%s: %s", name, row)
    if not datasets:
        raise ValueError(f"no dataset under {', '.join(str(f.parent) for f in folders[:1])} has a format "
                         "(--formats), a preset or --auto-header")
    loso_result = None
    if loso and defaults_parsed:
        from training.bench.parse_loso import leave_one_out

        loso_result = leave_one_out({n: (lines, fmt) for n, (lines, _, fmt) in defaults_parsed.items()},
                                    lambda n, lines, fmt: grouping_accuracy(defaults_parsed[n][1], our_parse(lines, fmt)[0]))
        for name, ga in loso_result["ga_loso"].items():
            datasets[name]["ga_loso"] = ga

    def mean(field: str) -> float | None:
        return mean_of([d[field] for d in datasets.values() if field in d])

    fields = ["ga", "pa", "ga_loso", "ga_drain3_default", "ga_drain3_same_masks", "ga_same_parser_true_content"] + \
        [f"{m}_{v}" for v in VARIANTS for m in ("ga", "pa")]
    result = {"datasets": datasets} | {f"mean_{f}": mean(f) for f in fields}
    if loso_result is not None:
        result["loso"] = {k: v for k, v in loso_result.items() if k != "ga_loso"} | {
            "datasets": sorted(loso_result["ga_loso"]),
            "mean_ga_same_datasets": mean_of([datasets[n]["ga"] for n in loso_result["ga_loso"]])}
    result |= {
        "settings_chosen_on": SETTINGS_CHOSEN_ON,
        "default_masks_chosen_on": DEFAULT_MASKS_CHOSEN_ON,
        # published GAs have 3 decimals (rounded half up): compare at that precision
        "below_published_drain": sorted(name for name, d in datasets.items() if d["published_drain_ga"] is not None
                                        and _round3(d["ga"]) < d["published_drain_ga"]),
    }
    return result


def mean_of(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def _cell(d: dict, field: str, bold: bool = False) -> str:
    value = d.get(field)
    if value is None:
        return ""
    return f"**{value:.3f}**" if bold else f"{value:.3f}"


def parse_table(result: dict) -> str:
    """Markdown: one row a dataset -- what parsed it, the baselines, each variant's GA, the
    headline GA and PA -- and the means."""
    cols = [("Drain3 defaults", "ga_drain3_default"), ("Drain3 + our masks & thresholds", "ga_drain3_same_masks"),
            ("ours on true Content", "ga_same_parser_true_content"), ("preset", "ga_preset"),
            ("given header + default masks", "ga_format"), ("detected header", "ga_auto"),
            ("leave-one-system-out", "ga_loso")]
    cols = [(title, f) for title, f in cols if result.get(f"mean_{f}") is not None]
    lines = ["| dataset | lines | parsed with | " + " | ".join(t for t, _ in cols) +
             " | **GA** | **PA** | published Drain | groups / true |",
             "|---|---:|---|" + "---:|" * (len(cols) + 4)]
    for name, d in result["datasets"].items():
        used = d.get("preset") or d.get("format")
        lines.append(f"| {name} | {d['lines']} | {d['parsed_with']} {used} | " +
                     " | ".join(_cell(d, f) for _, f in cols) +
                     f" | {_cell(d, 'ga', True)} | {_cell(d, 'pa')} | {_cell(d, 'published_drain_ga')} | "
                     f"{d['groups']} / {d['true_groups']} |")
    means = {f: result.get(f"mean_{f}") for _, f in cols}
    lines.append("| **mean** | | | " + " | ".join("" if v is None else f"{v:.3f}" for v in means.values()) +
                 f" | **{result['mean_ga']:.3f}** | {result['mean_pa']:.3f} | | |")
    lines.append("")
    lines.append(f"Preset settings chosen on: {result['settings_chosen_on']}.")
    lines.append(f"Default masks chosen on: {result['default_masks_chosen_on']}.")
    return "\n".join(lines)


def write_parse_outputs(result: dict, json_path: str | Path) -> list[Path]:
    json_path = Path(json_path)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(result, indent=2))
    md = json_path.with_suffix(".md")
    md.write_text(parse_table(result) + "\n")
    return [json_path, md]
