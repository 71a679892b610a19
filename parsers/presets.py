"""Log formats: header patterns, masks and Drain3 settings per kind of log.

A :class:`LogFormat` says how to split a raw line into header fields and the free-text
``Content`` (given to Drain3), what to mask in the content before Drain3 sees it, how deep and
how similar Drain3's tree works, which regex pulls sequence ids out of a line, and which file
names the template slots.

Headers are written as LogPAI does, ``<Date> <Time> <Pid> <Level> <Component>: <Content>``:
fields in angle brackets, literal text between them matched as written, any run of spaces as
``\\s+``. ``field_patterns`` tighten single fields (default: lazy ``.*?``); a format whose
header cannot be said that way (an optional ``[pid]``) gives ``header_regex`` with named
groups instead.

Sessions: a format with ``id_pattern`` groups lines by the ids it finds (HDFS blocks, OpenStack
requests); the others group by ``session_field`` (BGL/HPC: Node, Thunderbird: the node name)
and ``window_s`` time windows (default one hour, fixed; ``step_s`` makes them slide); see
parsers.sessions.

Presets cover HDFS, BGL, Hadoop, Spark, Zookeeper, OpenStack, HPC, Linux, Thunderbird, Apache
and syslog. Their masks and Drain settings describe the *format* of each system's lines (what
its ids, addresses, paths, sizes and numbers look like); no ground-truth template is read. How
they were chosen, plainly: Hadoop, Spark, Zookeeper, BGL, Linux (syslog), Thunderbird and
Apache take the LogPAI Drain benchmark's per-dataset regexes, similarity thresholds and depths
(logpai/logparser ``logparser/Drain/benchmark.py``), which were set for the LogHub 2k files;
HDFS (the generic default masks), HPC (every number) and OpenStack (LogPAI's three regexes
with token boundaries) are our own, written with Grouping Accuracy on those same LogHub 2k
files as the target. So ``seqenc bench parse`` on LogHub is an in-sample figure for every
preset (training.bench.parse says more). Users add their own formats (or extend a preset's masks)
in a JSON file, see :func:`load_formats`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from pathlib import Path

from parsers.sessions import SessionSpec

# Masks are written without look-arounds (``\b`` / ``\B`` instead), so Python's ``re`` (Drain3's
# masker, parameter extraction) and polars' Rust regex (the vectorised ingest) read them the same.
# Building blocks, named by what they mask (the mask name becomes the default slot-key name).
PATH = (r"\B/(?:[\w.$\-]+/)+[\w.$\-]*", "PATH")
BLK = (r"\bblk_-?\d+(?:\s+blk_-?\d+)*\b", "BLK")  # one id, or a list of them as one value
IP = (r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d{1,5})?\b", "IP")
UUID = (r"\b[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}\b", "UUID")
HEX = (r"\b0x[0-9a-fA-F]+\b", "HEX")
NUM = (r"(?:\B[-+])?\b\d+(?:\.\d+)?\b", "NUM")  # a sign only when it starts the token
# The HDFS preset's masks: the generic defaults before issue 23, kept so its figures stay.
HDFS_MASKS: tuple[tuple[str, str], ...] = (PATH, BLK, IP, UUID, HEX, NUM)

# Generic value shapes (issue 23), for a format that names no masks of its own. Order matters:
# what may contain the others first (a URL or path holds dates and numbers, a date-time holds a
# clock), numbers last. Each is one token to Drain, so a value whose text has spaces (``Sun Jul 10
# 12:34:56 2005``) or a variable count of parts (``10.1.1.2,10.1.1.3``) no longer splits a template
# by its length.
URL = (r"\b[a-zA-Z][a-zA-Z0-9+.-]*://\S+", "URL")
EMAIL = (r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b", "EMAIL")
PATH_QUERY = (r"\B/(?:[\w.$\-]+/)+[\w.$\-]*(?:\?\S*)?", "PATH")  # PATH, and a URL's ?query after it
_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*"
DATETIME_TEXT = (r"\b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)[a-z]*,?\s+" + _MONTH +
                 r"\s+\d{1,2}\s+\d{1,2}:\d{2}:\d{2}(?:\s+\d{4})?\b", "DATETIME")  # Sun Jul 10 12:34:56 2005
DATETIME_ISO = (r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?\b", "DATETIME")
DATE = (r"\b\d{4}[-/.]\d{1,2}[-/.]\d{1,2}\b", "DATE")
TIME = (r"\b\d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?\b", "TIME")
IP_LIST = (r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d{1,5})?(?:,\d{1,3}(?:\.\d{1,3}){3}(?::\d{1,5})?)*\b", "IP")
HOST_PORT = (r"\b(?:[a-zA-Z0-9-]+\.)+[a-zA-Z][a-zA-Z0-9-]*:\d{1,5}\b", "HOST")  # a host name with a port
# blk_-42, attempt_1445_0020_m_0, or a list of such ids as one value; the prefix stays in the
# template (``blk_<ID>``, as LogHub writes ``blk_<*>``): a ``keep`` group (:func:`value_pattern`)
ID_LIST = (r"\b(?P<keep>[a-zA-Z][a-zA-Z_]*_)-?\d\w*(?:\s+[a-zA-Z][a-zA-Z_]*_-?\d\w*)*\b", "ID")
SIZE = (r"\b\d+(?:\.\d+)?\s?(?:[KMGTP]i?B|bytes|B)\b", "SIZE")  # 384.0 B, 12 KB, 5 GiB, 1190 bytes
VERSION = (r"\bv?\d+(?:\.\d+){2,}\b", "VERSION")  # 1.2.3, v6.1.7601.23505 (after IP: four parts)
HEX_ID = (r"\b[0-9a-fA-F]*[0-9][0-9a-fA-F]*[a-fA-F][0-9a-fA-F]*\b|"
          r"\b[0-9a-fA-F]*[a-fA-F][0-9a-fA-F]*[0-9][0-9a-fA-F]*\b", "HEX")  # hex with digits and letters
DEFAULT_MASKS: tuple[tuple[str, str], ...] = (URL, EMAIL, PATH_QUERY, DATETIME_TEXT, DATETIME_ISO, DATE, TIME,
                                              IP_LIST, HOST_PORT, ID_LIST, UUID, HEX, SIZE, VERSION, HEX_ID, NUM)
IP_SLASH = (r"/?" + IP[0], "IP")  # Zookeeper writes peers as /10.10.34.11:3888
CLOCK = (r"\b\d{2}:\d{2}:\d{2}\b", "TIME")
SIZE_UNIT = (r"\b[KGTM]?B\b", "UNIT")
HOST = (r"\b(?:[\w-]+\.){2,}[\w-]+", "HOST")  # dotted names: hosts, classes, files
CORE = (r"\bcore\.\d+\b", "CORE")
IP_LIST = (r"\b(?:\d{1,3}(?:\.\d{1,3}){3},?)+", "IP")
SLASH_PATH = (r"/\S+", "PATH")


KEEP = "(?P<keep>"  # a mask whose pattern starts with this group keeps its text before the mask token


def value_pattern(pattern: str) -> str:
    """The part of a mask's pattern that matches the masked value: without its leading ``keep``
    group (and a word boundary before it), whose text stays in the content (``blk_<ID>``)."""
    start = pattern.find(KEEP)
    if start < 0:
        return pattern
    depth, i = 0, start
    while i < len(pattern):
        if pattern[i] == "\\":
            i += 2
            continue
        depth += pattern[i] == "("
        depth -= pattern[i] == ")"
        i += 1
        if depth == 0:
            break
    head = pattern[:start]
    return (head[:-2] if head.endswith("\\b") else head) + pattern[i:]


@dataclass(frozen=True)
class LogFormat:
    name: str
    header: str = "<Content>"
    header_regex: str | None = None  # overrides ``header`` when set (named groups, one is Content)
    field_patterns: dict[str, str] = field(default_factory=dict)
    ts_fields: tuple[str, ...] = ()
    ts_format: str | None = None  # strptime format of the ts_fields joined by one space, or "epoch"
    # sessions (parsers.sessions): ids pulled from the content, else field x time windows
    id_pattern: str | None = None  # sequence ids in the content (a line may name several)
    session_field: str | None = None  # header field that owns a window (e.g. Node); None: all lines
    window_s: float = 3600.0
    step_s: float | None = None  # < window_s: sliding windows
    masks: tuple[tuple[str, str], ...] = DEFAULT_MASKS  # (regex, NAME), applied in order
    depth: int = 4
    sim_th: float = 0.5
    extra_delimiters: tuple[str, ...] = ()
    key_names: str | None = None  # a file under parsers/key_names/, or a path
    label_field: str | None = None  # a ground-truth field in the header (BGL): kept out of the keys
    # issue 49, chosen on the twelve shared LogHub systems (docs/data-layout.md); the presets keep
    # the plain Drain behaviour (False, 0) so their figures stay
    mask_shapes: bool = True  # tokens holding a mask compared by shape (parsers.drain)
    split_words: int = 3  # a template's word slots with at most this many words split it (parsers.word_split)

    def regex(self) -> re.Pattern:
        if self.header_regex:
            rx = re.compile(self.header_regex)
            if "Content" not in rx.groupindex:
                raise ValueError(f"format {self.name!r}: header_regex has no (?P<Content>...) group")
            return rx
        parts = re.split(r"(<[^<>]+>)", self.header)
        out = []
        for i, part in enumerate(parts):
            if i % 2 == 0:  # literal text; a run of spaces matches any whitespace run
                out.append(r"\s+".join(re.escape(p) for p in re.split(r" +", part)))
            else:
                name = part[1:-1]
                default = ".*" if name == "Content" else ".*?"
                out.append(f"(?P<{name}>{self.field_patterns.get(name, default)})")
        return re.compile("^" + "".join(out) + "$")

    def session_spec(self) -> SessionSpec:
        if self.id_pattern:
            return SessionSpec(id_pattern=self.id_pattern)
        return SessionSpec(field=self.session_field, window_s=self.window_s, step_s=self.step_s)

    @cached_property
    def fields(self) -> list[str]:
        """Header fields in order (Content excluded)."""
        return [f for f in self.regex().groupindex if f != "Content"]

    @cached_property
    def key_fields(self) -> list[str]:
        """Header fields that become keys of the object (the label field never does)."""
        return [f for f in self.fields if f != self.label_field]

    @classmethod
    def from_dict(cls, data: dict, base: LogFormat | None = None) -> LogFormat:
        """A format from JSON-like data; with ``base`` (``"extends": "<preset>"``) only the given
        fields change, and ``"extra_masks"`` are applied before the base's masks."""
        data = dict(data)
        known = {f.name for f in fields(cls)}
        extra_masks = tuple(tuple(m) for m in data.pop("extra_masks", ()))
        data.pop("extends", None)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown log format fields: {unknown}")
        for name in ("ts_fields", "extra_delimiters"):
            if name in data:
                data[name] = tuple(data[name])
        if "masks" in data:
            data["masks"] = tuple(tuple(m) for m in data["masks"])
        fmt = replace(base, **data) if base else cls(**data)
        if extra_masks:
            fmt = replace(fmt, masks=extra_masks + fmt.masks)
        for pattern, _ in fmt.masks:
            re.compile(pattern)  # fail early on a bad user regex
        fmt.regex()
        return fmt


def _fmt(name: str, header: str, masks=DEFAULT_MASKS, **kw) -> LogFormat:
    """A preset: plain Drain's comparison of tokens and no word splits (their figures predate them)."""
    return LogFormat(name=name, header=header, masks=tuple(masks), mask_shapes=False, split_words=0, **kw)


_HDFS_FIELDS = {"Date": r"\d{6}", "Time": r"\d{6}", "Pid": r"\d+", "Level": r"[A-Z]+", "Component": r"[^\s:]+"}
_SYSLOG_RX = (r"^(?P<Month>[A-Z][a-z]{2})\s+(?P<Date>\d{1,2})\s+(?P<Time>\d{2}:\d{2}:\d{2})\s+(?P<Level>\S+)\s+"
              r"(?P<Component>.+?)(?:\[(?P<PID>\d+)\])?:\s*(?P<Content>.*)$")

PRESETS: dict[str, LogFormat] = {
    "hdfs": _fmt("hdfs", "<Date> <Time> <Pid> <Level> <Component>: <Content>", HDFS_MASKS, field_patterns=_HDFS_FIELDS,
                 ts_fields=("Date", "Time"), ts_format="%y%m%d %H%M%S", id_pattern=r"blk_-?\d+",
                 key_names="hdfs.json"),
    "hadoop": _fmt("hadoop", "<Date> <Time> <Level> [<Process>] <Component>: <Content>",
                   field_patterns={"Date": r"\d{4}-\d{2}-\d{2}", "Time": r"[\d:,]+", "Level": r"[A-Z]+"},
                   ts_fields=("Date", "Time"), ts_format="%Y-%m-%d %H:%M:%S,%f", masks=(IP,)),
    "spark": _fmt("spark", "<Date> <Time> <Level> <Component>: <Content>",
                  field_patterns={"Date": r"\d{2}/\d{2}/\d{2}", "Time": r"[\d:]+", "Level": r"[A-Z]+",
                                  "Component": r"[^\s:]+"},
                  ts_fields=("Date", "Time"), ts_format="%y/%m/%d %H:%M:%S", masks=(IP, SIZE_UNIT, HOST)),
    "zookeeper": _fmt("zookeeper", "<Date> <Time> - <Level> [<Node>:<Component>@<Id>] - <Content>",
                      field_patterns={"Date": r"\d{4}-\d{2}-\d{2}", "Time": r"[\d:,]+", "Level": r"[A-Z]+",
                                      "Node": r".*?", "Component": r"[^\s:@\]]+", "Id": r"\d+"},
                      ts_fields=("Date", "Time"), ts_format="%Y-%m-%d %H:%M:%S,%f", masks=(IP_SLASH,)),
    "bgl": _fmt("bgl", "<Label> <Timestamp> <Date> <Node> <Time> <NodeRepeat> <Type> <Component> <Level> <Content>",
                field_patterns={"Label": r"\S+", "Timestamp": r"\d+", "Date": r"\S+", "Node": r"\S+",
                                "Time": r"\S+", "NodeRepeat": r"\S+", "Type": r"\S+", "Component": r"\S+",
                                "Level": r"\S+"},
                ts_fields=("Time",), ts_format="%Y-%m-%d-%H.%M.%S.%f", label_field="Label", masks=(CORE,),
                session_field="Node"),
    "hpc": _fmt("hpc", "<LogId> <Node> <Component> <State> <Time> <Flag> <Content>",
                field_patterns={"LogId": r"\d+", "Node": r".+?", "Component": r"\S+", "State": r"\S+",
                                "Time": r"\d+", "Flag": r"-?\d+"}, masks=(NUM,),
                ts_fields=("Time",), ts_format="epoch", session_field="Node"),
    # syslog stamps carry no year: read as 1900 (a log that spans New Year's Eve is misordered there)
    "linux": _fmt("linux", "", header_regex=_SYSLOG_RX, masks=(IP, CLOCK), sim_th=0.39, depth=6,
                  ts_fields=("Month", "Date", "Time"), ts_format="%b %d %H:%M:%S"),
    "syslog": _fmt("syslog", "", header_regex=_SYSLOG_RX, masks=(IP, CLOCK), sim_th=0.39, depth=6,
                   ts_fields=("Month", "Date", "Time"), ts_format="%b %d %H:%M:%S"),
    "thunderbird": _fmt(
        "thunderbird", "",
        header_regex=(r"^(?P<Label>\S+)\s+(?P<Timestamp>\d+)\s+(?P<Date>\S+)\s+(?P<User>\S+)\s+(?P<Month>\S+)\s+"
                      r"(?P<Day>\d+)\s+(?P<Time>\S+)\s+(?P<Location>\S+)\s+(?P<Component>[^\s\[:]+)"
                      r"(?:\[(?P<PID>\d+)\])?:\s*(?P<Content>.*)$"),
        label_field="Label", masks=(IP,), ts_fields=("Timestamp",), ts_format="epoch", session_field="User"),
    "openstack": _fmt("openstack", "<Logrecord> <Date> <Time> <Pid> <Level> <Component> [<ADDR>] <Content>",
                      field_patterns={"Logrecord": r"\S+", "Date": r"\d{4}-\d{2}-\d{2}", "Time": r"[\d:.]+",
                                      "Pid": r"\d+", "Level": r"[A-Z]+", "Component": r"\S+", "ADDR": r"[^\]]*"},
                      ts_fields=("Date", "Time"), ts_format="%Y-%m-%d %H:%M:%S.%f",
                      id_pattern=r"req-[0-9a-f-]{36}", masks=(IP_LIST, SLASH_PATH, NUM), depth=5),
    "apache": _fmt("apache", "[<Time>] [<Level>] <Content>",
                   field_patterns={"Time": r"[^\]]+", "Level": r"[a-z]+"},
                   ts_fields=("Time",), ts_format="%a %b %d %H:%M:%S %Y", masks=(IP,)),
}
HDFS = PRESETS["hdfs"]


def load_formats(path: str | Path) -> dict[str, LogFormat]:
    """User formats from a JSON file: ``{"formats": {"myapp": {"header": ..., "masks": [[regex,
    NAME], ...]}, "hdfs-strict": {"extends": "hdfs", "sim_th": 0.6, "extra_masks": [...]}}}``."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    out: dict[str, LogFormat] = {}
    for name, spec in data.get("formats", {}).items():
        base_name = spec.get("extends")
        base = out.get(base_name) or PRESETS.get(base_name) if base_name else None
        if base_name and base is None:
            raise ValueError(f"format {name!r} extends unknown format {base_name!r}")
        out[name] = LogFormat.from_dict({**spec, "name": name}, base)
    return out


def resolve(preset: str | LogFormat, formats_file: str | Path | None = None) -> LogFormat:
    if isinstance(preset, LogFormat):
        return preset
    known = {**PRESETS, **(load_formats(formats_file) if formats_file else {})}
    try:
        return known[preset]
    except KeyError:
        raise ValueError(f"unknown log format {preset!r}; known: {sorted(known)}") from None
