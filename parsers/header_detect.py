"""Header detection: propose a log format's header from a sample of its lines.

A user who knows nothing of a log's layout gets a header in the format syntax of
parsers.presets (``<Date> <Time> <Level> [<Thread>] <Component>: <Content>``), which ingest and
``seqenc bench parse`` use with ``--auto-header`` and ``seqenc logformat suggest FILE`` prints.

How (one left-to-right pass over the sample, field by field, as LogPAI's formats are written):
at each step every sample line is at its own offset; the first *field kind* (``KINDS``, in
order) whose pattern matches there on at least ``SHARE`` of the sample becomes the next field,
and the lines where it matched move past it (the others drop out: they would not match the
header, so they count against every later field too). Kinds:

* ``timestamp``: a date and a clock in one of the common layouts (ISO, ``yy/mm/dd``, syslog's
  ``Jun 14 15:16:01``, ``Sun Dec 04 04:47:44 2005``, ``20171223-22:15:29:606``, HDFS's
  ``081109 203615``, ...), one field per whitespace-separated part (the format syntax splits
  fields at spaces); its strptime format is found by trying ``TS_FORMATS`` on the sample;
* ``bracket``: ``[...]`` (one level of nesting, as ``[QuorumPeer[myid=1]/...]``), the brackets
  literal; ``level``: a log level word (INFO, Warning, notice, ..., or one capital of V D I W E
  F A); ``component``: a name ending in ``:`` (``dfs.DataNode$PacketResponder:``,
  ``sshd(pam_unix)[19939]:``, ``kernel[0]:``, ``launchd[1] (com.apple.xpc):``) -- the header ends
  after it;
  ``number``: digits (a pid, a thread, a sequence number); ``dash`` / ``bar``: a lone ``-`` or
  ``|`` separator;
* ``token``: any other word. It joins the header only when a typed field (any kind above)
  follows it: a run of words that leads to no typed field is the start of the content.

A separator glued to a field (``,`` ``|`` ``;``) on ``SHARE`` of the lines is literal text of the
header. The pass stops at a component, where no kind reaches ``SHARE``, or after ``MAX_FIELDS``.

Choices where the task is vague: ``SHARE`` = 0.95 (a header that fails one line in twenty is
still the header: continuation lines of a stack trace do not match any header); the proposal
keeps the lenient default field patterns (a field is whatever lies between its neighbours), so
lines of a slightly different shape still split, and ``field_patterns`` (what each field looked
like) are reported for a user who wants a stricter format. A proposal that matches fewer than
``MIN_COVERAGE`` of the sample falls back to the whole line as ``<Content>``.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field

SHARE = 0.95
MIN_COVERAGE = 0.9
MAX_FIELDS = 14
SAMPLE_LINES = 2000
EPOCH_RANGE = (946_684_800, 2_208_988_800)  # seconds since 1970 of 2000-01-01 and 2040-01-01

_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*"
_DAY = r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)[a-z]*"
_CLOCK = r"\d{1,2}:\d{1,2}(?::\d{1,2})?(?:[.,:]\d{1,9})?"  # minutes, seconds may lack their zero (HealthApp: 23:1:5:778)
_TZ = r"(?:Z|[+-]\d{2}:?\d{2})?"
# date + clock layouts, the longest first; each part separated by spaces becomes a field
_TIMESTAMPS = (
    rf"{_DAY},?\s+{_MONTH}\s+\d{{1,2}}\s+{_CLOCK}(?:\s+\d{{4}})?",  # Sun Dec 04 04:47:44 2005
    rf"{_MONTH}\s+\d{{1,2}}(?:\s+\d{{4}})?\s+{_CLOCK}",  # Jun 14 15:16:01
    rf"\d{{4}}[-/.]\d{{1,2}}[-/.]\d{{1,2}}(?:[T_-]|\s+){_CLOCK}{_TZ}",  # 2015-10-18 18:01:47,978
    r"\d{4}-\d{2}-\d{2}-\d{2}\.\d{2}\.\d{2}(?:\.\d+)?",  # 2005-06-03-15.42.50.675872
    rf"\d{{8}}[-T_ ]?{_CLOCK}",  # 20171223-22:15:29:606
    rf"\d{{1,2}}[-/.]\d{{1,2}}[-/.]\d{{2,4}}\s+{_CLOCK}",  # 17/06/09 20:10:40
    rf"\d{{1,2}}[-/.]\d{{1,2}}\s+{_CLOCK}",  # 03-17 16:13:38.811, 10.30 16:49:06
    rf"\d{{1,2}}/{_MONTH}/\d{{4}}:{_CLOCK}(?:\s+[+-]\d{{4}})?",  # 01/May/2023:10:00:00 +0000 (access logs)
    r"\d{6}\s+\d{6}",  # 081109 203615 (checked as a date and a time below)
    r"\d{4}[-/.]\d{1,2}[-/.]\d{1,2}",  # a date alone
    r"\d{1,2}:\d{2}:\d{1,2}(?:[.,:]\d{1,9})?",  # a clock alone (hh:mm:ss)
)
# strptime formats tried on the joined parts of a timestamp (joined by one space, as ingest does):
# each date + clock layout with its seconds bare or with a fraction after "." "," or ":", and the
# ISO "T" forms also with a zone ("Z", "+01:00"); then the layouts that are neither
_TS_LAYOUTS = (
    "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S", "%Y/%m/%d %H:%M:%S", "%Y-%m-%d-%H.%M.%S", "%y/%m/%d %H:%M:%S",
    "%d/%m/%Y %H:%M:%S", "%m/%d/%Y %H:%M:%S", "%b %d %H:%M:%S", "%b %d %Y %H:%M:%S", "%a %b %d %H:%M:%S %Y",
    "%Y%m%d-%H:%M:%S", "%m-%d %H:%M:%S", "%m.%d %H:%M:%S",
)
TS_FORMATS = tuple(
    layout.replace("%S", "%S" + fraction, 1) + zone
    for layout in _TS_LAYOUTS for fraction in ("", ".%f", ",%f", ":%f")
    for zone in (("", "Z", "%z") if "T" in layout else ("",))
) + ("%y%m%d %H%M%S", "%d/%b/%Y:%H:%M:%S %z", "%Y.%m.%d", "%Y-%m-%d")
_LEVEL = (r"(?i:INFO|INFORMATION|WARN|WARNING|ERROR|ERR|DEBUG|TRACE|FATAL|CRIT|CRITICAL|NOTICE|SEVERE|ALERT|"
          r"EMERG|VERBOSE|FINE|FINER|FINEST|CONFIG)\b|[VDIWEFA](?=\s)")
_END = r"(?=[\s|,;]|$)"
KINDS = {  # name: pattern matched at a line's offset (Python re, look-arounds allowed here)
    "timestamp": re.compile("(?:" + "|".join(_TIMESTAMPS) + ")" + _END),
    "bracket": re.compile(r"\[[^\[\]]*(?:\[[^\[\]]*\][^\[\]]*)*\]"),
    "level": re.compile("(?:" + _LEVEL + ")" + _END),
    "component": re.compile(r"[^\s\[\]:|,;{}\"'=]+(?:\([^()\s]*\))?(?:\[[^\[\]\s]*\])?(?:\s?\([^()]*\))?:(?=\s|$)"),
    "number": re.compile(r"\d+" + _END),
    "dash": re.compile(r"-(?=\s)"),
    "bar": re.compile(r"\|(?=\s)"),
    "token": re.compile(r"[^\s|,;\"'{]\S*?(?=[\s|,;]|$)"),  # a word; a quoted one is content
}
SEPARATORS = (",", "|", ";")  # glued to a field
SEPARATOR_KINDS = {"dash": "-", "bar": "|"}  # standing alone between fields: literal text, no field
FIELD_PATTERNS = {"level": r"\S+", "number": r"\d+", "token": r"\S+"}


@dataclass
class Suggestion:
    """A proposed header. ``header`` in the format syntax; ``fields`` the header's field names;
    ``ts_fields`` / ``ts_format`` the timestamp (empty / None when none parsed); ``coverage`` the
    share of the sample lines the header matches; ``field_patterns`` what each field looked like."""

    header: str
    fields: list[str] = field(default_factory=list)
    ts_fields: tuple[str, ...] = ()
    ts_format: str | None = None
    coverage: float = 1.0
    sample: int = 0
    field_patterns: dict[str, str] = field(default_factory=dict)

    def format_spec(self) -> dict:
        """The JSON of one format in parsers.presets.load_formats' file."""
        spec: dict = {"header": self.header}
        if self.ts_format:
            spec |= {"ts_fields": list(self.ts_fields), "ts_format": self.ts_format}
        return spec

    def log_format(self, name: str = "auto"):
        from parsers.presets import LogFormat

        return LogFormat.from_dict({"name": name, **self.format_spec()})


@dataclass
class _Step:
    kind: str
    texts: list[str]  # what the field matched, per line that matched
    sep_after: str = ""  # a literal separator glued after the field ("," "|" ";"), if any
    inner: str = ""  # a bracket's: "timestamp" or "level" when every bracket holds one

    def values(self) -> list[str]:
        """What the field holds per line (a bracket's text without its brackets)."""
        return [t[1:-1] for t in self.texts] if self.kind == "bracket" else self.texts


def _ts_format(values: list[str]) -> str | None:
    """The first of TS_FORMATS that parses every value (parts joined by one space), else None."""
    for fmt in TS_FORMATS:
        try:
            for v in values:
                dt.datetime.strptime(v, fmt)
        except ValueError:
            continue
        return fmt
    return None


def _scan(lines: list[str]) -> list[_Step]:
    """The left-to-right pass of the module docstring: the chosen steps, trailing words trimmed."""
    n = len(lines)
    pos: dict[int, int] = {i: 0 for i in range(n)}  # the lines still matching -> their offsets
    steps: list[_Step] = []
    for _ in range(MAX_FIELDS):
        for i in pos:
            while pos[i] < len(lines[i]) and lines[i][pos[i]].isspace():
                pos[i] += 1
        chosen = None
        for kind, rx in KINDS.items():
            hits = {i: m for i in pos if (m := rx.match(lines[i], pos[i])) and m.end() > m.start()}
            if len(hits) < SHARE * n:
                continue
            if kind == "timestamp" and all(re.fullmatch(r"\d{6}\s+\d{6}", m.group(0)) for m in hits.values()) \
                    and _ts_format([" ".join(m.group(0).split()) for m in hits.values()]) != "%y%m%d %H%M%S":
                continue  # two six-digit numbers that are not a date and a time
            chosen = kind, hits
            break
        if chosen is None:
            break
        kind, hits = chosen
        pos = {i: m.end() for i, m in hits.items()}
        step = _Step(kind, [m.group(0) for m in hits.values()])
        if kind == "bracket":
            for inner in ("timestamp", "level"):
                if all(re.fullmatch(KINDS[inner].pattern, v) for v in step.values()):
                    step.inner = inner
                    break
        for sep in SEPARATORS:
            glued = [i for i in pos if lines[i][pos[i]:pos[i] + 1] == sep]
            if len(glued) >= SHARE * n:
                step.sep_after = sep
                pos = {i: pos[i] + 1 for i in glued}
                break
        steps.append(step)
        if kind == "component" or all(pos[i] >= len(lines[i]) for i in pos):
            break
    while steps and steps[-1].kind == "token":  # words that lead to no typed field: content
        steps.pop()
    if steps and steps[-1].kind in SEPARATOR_KINDS and all(s.kind in ("token", *SEPARATOR_KINDS) for s in steps):
        steps.clear()  # words and separators only: no header
    return steps


def _names(steps: list[_Step]) -> list[list[str]]:
    """Field names per step (a timestamp has one per part, a separator none)."""
    used: dict[str, int] = {}

    def unique(base: str) -> str:
        used[base] = used.get(base, 0) + 1
        return base if used[base] == 1 else f"{base}{used[base]}"

    out = []
    numbers = iter(("Pid", "Tid"))
    for step in steps:
        if step.kind == "timestamp":
            parts = len(step.texts[0].split())
            names = {1: ["Timestamp"], 2: ["Date", "Time"], 3: ["Month", "Day", "Time"],
                     4: ["Month", "Day", "Year", "Time"]}.get(parts)
            if names is None or len(step.texts[0].split()) == 4 and re.match(_DAY, step.texts[0]):
                names = ["Weekday", "Month", "Day", "Time", "Year"][:parts]
            out.append([unique(n) for n in names])
        elif step.kind in SEPARATOR_KINDS:
            out.append([])
        else:
            inner = {"timestamp": "Time", "level": "Level"}.get(step.inner, "Context")
            base = {"bracket": inner, "level": "Level", "component": "Component", "token": "Field"}.get(
                step.kind) or next(numbers, "Number")
            out.append([unique(base)])
    return out


def _timestamp(steps: list[_Step], names: list[list[str]]) -> tuple[tuple[str, ...], str | None]:
    """``(ts_fields, ts_format)``: the first timestamp whose format has a clock, else the first
    that parses, else a number that is seconds since 1970 on every line (years 2000-2039,
    ``"epoch"``); ``((), None)`` when none."""
    found = []
    for step, fields in zip(steps, names):
        one_field = step.kind == "bracket" and step.inner == "timestamp"
        if (step.kind == "timestamp" and len({len(t.split()) for t in step.texts}) == 1) or one_field:
            fmt = _ts_format([" ".join(t.split()) for t in step.values()])
            if fmt:
                found.append((tuple(fields), fmt))
    for fields, fmt in found:
        if "%H" in fmt:
            return fields, fmt
    if found:
        return found[0]
    for step, fields in zip(steps, names):
        if step.kind == "number" and all(len(t) == 10 and EPOCH_RANGE[0] <= int(t) < EPOCH_RANGE[1]
                                         for t in step.texts):
            return tuple(fields), "epoch"
    return (), None


def suggest_header(lines: list[str]) -> Suggestion:
    """A header for these lines (blank lines are skipped; at most ``SAMPLE_LINES`` are read)."""
    sample = [ln.rstrip("\r\n") for ln in lines if ln.strip()][:SAMPLE_LINES]
    if not sample:
        raise ValueError("no lines to read a header from (the sample is empty or blank)")
    steps = _scan(sample)
    names = _names(steps)
    parts: list[str] = []
    patterns: dict[str, str] = {}
    ts_fields, ts_format = _timestamp(steps, names)
    for step, fields in zip(steps, names):
        if step.kind == "timestamp":
            text = " ".join(f"<{f}>" for f in fields)
            for f in fields:
                patterns[f] = r"\S+"
        elif step.kind == "bracket":
            text = f"[<{fields[0]}>]"
            patterns[fields[0]] = r"[^\]]*(?:\][^\]]*)*?"
        elif step.kind == "component":
            text = f"<{fields[0]}>:"
            patterns[fields[0]] = r"[^\s:]+"
        elif step.kind in SEPARATOR_KINDS:
            text = SEPARATOR_KINDS[step.kind]
        else:
            text = f"<{fields[0]}>"
            patterns[fields[0]] = FIELD_PATTERNS[step.kind]
        parts.append(text + step.sep_after)
    header = _join(parts, steps)
    suggestion = Suggestion(header, [f for fs in names for f in fs], ts_fields, ts_format, 1.0, len(sample), patterns)
    rx = suggestion.log_format().regex()
    suggestion.coverage = sum(1 for ln in sample if rx.match(ln)) / len(sample)
    if suggestion.coverage < MIN_COVERAGE:
        return Suggestion("<Content>", [], (), None, 1.0, len(sample), {})
    return suggestion


def _join(parts: list[str], steps: list[_Step]) -> str:
    """The header text: fields separated by a space, except after a glued separator that is
    followed by no space in the lines (``a|b|c``), then ``<Content>``."""
    if not parts:
        return "<Content>"
    out = ""
    for part, step in zip(parts, steps):
        out += part
        out += "" if step.sep_after in ("|",) else " "
    return out + "<Content>"


def read_sample(path, n: int = SAMPLE_LINES) -> list[str]:
    """The first ``n`` non-blank lines of a text file (gzip by suffix), undecodable bytes replaced."""
    import gzip
    from pathlib import Path

    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    out: list[str] = []
    with opener(path, "rt", encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if line.strip():
                out.append(line.rstrip("\r\n"))
                if len(out) >= n:
                    break
    return out
