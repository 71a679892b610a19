"""Logs of any format (issue 23): header detection, the generic masks, Parsing Accuracy,
``seqenc bench parse --formats/--auto-header``, ``seqenc logformat suggest`` and ingest with
``--auto-header``."""

import json
import random
import re

import polars as pl
import pytest
from shared_data import DATA, require

from parsers.header_detect import suggest_header
from parsers.logs import LineParser
from parsers.presets import DEFAULT_MASKS, HDFS_MASKS, PRESETS, LogFormat, load_formats
from training.bench.parse import PUBLISHED_DRAIN_GA, normalize_template, parsing_accuracy
from training.cli.main import main

LOGHUB = DATA / "loghub"
# the eight shared sets' layouts as LogPAI writes them, in the format syntax: what a user knows
HEADERS = {
    "hdfs": "<Date> <Time> <Pid> <Level> <Component>: <Content>",
    "hadoop": "<Date> <Time> <Level> [<Process>] <Component>: <Content>",
    "spark": "<Date> <Time> <Level> <Component>: <Content>",
    "zookeeper": "<Date> <Time> - <Level> [<Node>:<Component>@<Id>] - <Content>",
    "bgl": "<Label> <Timestamp> <Date> <Node> <Time> <NodeRepeat> <Type> <Component> <Level> <Content>",
    "hpc": "<LogId> <Node> <Component> <State> <Time> <Flag> <Content>",
    "linux": "<Month> <Date> <Time> <Level> <Component>: <Content>",
    "openstack": "<Logrecord> <Date> <Time> <Pid> <Level> <Component> [<ADDR>] <Content>",
}
LOGHUB_MORE = DATA / "loghub-more"
# loghub-more's four (LogPAI's layouts; Mac's optional "(address)" needs a regex)
MORE_FORMATS = {
    "android": {"header": "<Date> <Time> <Pid> <Tid> <Level> <Component>: <Content>"},
    "healthapp": {"header": "<Time>|<Component>|<Pid>|<Content>"},
    "mac": {"header_regex": r"^(?P<Month>\S+)\s+(?P<Date>\d+)\s+(?P<Time>\S+)\s+(?P<User>\S+)\s+(?P<Component>.*?)"
                            r"\[(?P<PID>\d+)\]( \((?P<Address>[^)]*)\))?: (?P<Content>.*)$"},
    "openssh": {"header": "<Date> <Day> <Time> <Component> sshd[<Pid>]: <Content>"},
}

WORDS = ["open", "close", "session", "user", "connection", "failed", "ok", "done", "retry", "cache", "disk"]


def _content(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) + (str(rng.randint(0, 99)) if rng.random() < 0.2 else "")
                    for _ in range(rng.randint(1, 8)))


# layouts of many shapes (written here; no line of a real system): line maker, expected header
SHAPES = {
    "android-like": (lambda r, i: f"03-17 16:13:{i % 60:02d}.{i % 1000:03d}  {1700 + i % 5}  {2395 + i % 7} "
                     f"{r.choice('DIWEV')} {r.choice(['WindowManager', 'PowerManager'])}: {_content(r)}",
                     "<Date> <Time> <Pid> <Tid> <Level> <Component>: <Content>"),
    "apache-like": (lambda r, i: f"[Sun Dec 04 04:{i % 60:02d}:44 2005] [{r.choice(['notice', 'error'])}] {_content(r)}",
                    "[<Time>] [<Level>] <Content>"),
    "pipes": (lambda r, i: f"20171223-22:15:{i % 60:02d}:606|{r.choice(['Step_LSC', 'Step_SPUtils'])}|{30002312 + i}|"
              f"{_content(r)}", "<Timestamp>|<Field>|<Pid>|<Content>"),
    "syslog-like": (lambda r, i: f"Jul  {1 + i % 9} 09:00:{i % 60:02d} host-10-1 "
                    f"{r.choice(['kernel[0]', 'sshd(pam_unix)[2915]', 'cron', 'launchd[1] (com.apple.x.35704)'])}: "
                    f"{_content(r)}",
                    "<Month> <Day> <Time> <Field> <Component>: <Content>"),
    "bracket-time": (lambda r, i: f"[10.30 16:49:{i % 60:02d}] {r.choice(['chrome.exe', 'svc.exe'])} - {_content(r)}",
                     "[<Time>] <Field> - <Content>"),
    "comma-level": (lambda r, i: f"2016-09-28 04:30:{i % 60:02d}, {r.choice(['Info', 'Warning'])}        "
                    f"{r.choice(['CBS', 'CSI'])}    {_content(r)}", "<Date> <Time>, <Level> <Content>"),
    "iso-z": (lambda r, i: f"2023-05-01T10:00:{i % 60:02d}.123Z [worker-{i % 4}] {r.choice(['INFO', 'WARN'])} "
              f"c.e.Svc - {_content(r)}", "<Timestamp> [<Context>] <Level> <Field> - <Content>"),
    "spaced-bars": (lambda r, i: f"2024/07/01 0{i % 10}:{i % 60:02d}:07.{i % 1000:03d} | {r.choice(['INFO', 'WARN'])} | "
                    f"worker-{i % 4} | {_content(r)}", "<Date> <Time> | <Level> | <Field> | <Content>"),
    "access-log": (lambda r, i: f'10.0.0.{i % 250} - - [01/May/2023:10:00:{i % 60:02d} +0000] "GET /x/{i} HTTP/1.1" '
                   f'200 {i * 3}', "<Field> - - [<Time>] <Content>"),
    "label-first": (lambda r, i: f"{'-' if r.random() > 0.1 else 'ALERT'} {1131566461 + i} 2005.11.09 dn{i % 9} "
                    f"Nov 9 12:01:{i % 60:02d} dn/dn crond[{i}]: {_content(r)}",
                    "<Field> <Pid> <Timestamp> <Field2> <Month> <Day> <Time> <Field3> <Component>: <Content>"),
}
# lines that have no header: the whole line stays Content
NO_HEADER = {
    "prose": lambda r, i: _content(r),
    "json": lambda r, i: json.dumps({"ts": f"2020-01-01T00:00:{i % 60:02d}", "msg": _content(r)}),
    "mixed-starts": lambda r, i: (f"{i} " if i % 3 == 0 else "") + _content(r),
    "csv-ish": lambda r, i: f"{r.choice(WORDS)},{r.choice(WORDS)},{i}",
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_suggest_header_reads_many_shapes(shape):
    make, expected = SHAPES[shape]
    rng = random.Random(0)
    lines = [make(rng, i) for i in range(300)]
    s = suggest_header(lines)
    assert s.header == expected
    assert s.coverage >= 0.9
    fmt = s.log_format("x")
    parsed = LineParser(fmt, None).parse(lines[1])
    assert not isinstance(parsed, str) and parsed.groups["Content"]
    if s.ts_format:  # the proposed timestamp parses the sample's stamps
        assert LineParser(fmt, None).parse(lines[5]).ts is not None


@pytest.mark.parametrize("shape", sorted(NO_HEADER))
def test_suggest_header_leaves_headerless_lines_as_content(shape):
    rng = random.Random(1)
    lines = [NO_HEADER[shape](rng, i) for i in range(300)]
    s = suggest_header(lines)
    assert s.header == "<Content>" and s.fields == [] and s.ts_format is None


def test_suggest_header_edge_cases():
    with pytest.raises(ValueError, match="no lines"):
        suggest_header(["", "   "])
    # HDFS's compact stamps are a date and a time only when they read as one
    hdfs = [f"081109 2036{i % 60:02d} {148 + i} INFO dfs.DataNode: served block blk_{i}" for i in range(50)]
    s = suggest_header(hdfs)
    assert s.header == "<Date> <Time> <Pid> <Level> <Component>: <Content>"
    assert (s.ts_fields, s.ts_format) == (("Date", "Time"), "%y%m%d %H%M%S")
    numbers = [f"{990000 + i} {470000 + i} worker: step {i}" for i in range(50)]  # month 99: not a date
    assert "Timestamp" not in suggest_header(numbers).header and "Date" not in suggest_header(numbers).header
    # seconds since 1970 become the timestamp when nothing else is one
    epoch = [f"{i} node-{i % 7} {1077804742 + i} {r}: text {i}" for i, r in enumerate(["a", "b"] * 30)]
    assert suggest_header(epoch).ts_format == "epoch"


def test_loghub_headers_are_detected():
    """On the shared sets the detected header splits every line, with LogPAI's field count."""
    from training.bench.parse import read_loghub_folder

    for name, header in HEADERS.items():
        folder = next(p for p in require(LOGHUB).iterdir() if p.name.lower() == name)
        _, lines, _, _ = read_loghub_folder(folder)
        s = suggest_header(lines)
        assert s.coverage == 1.0, name
        if name != "zookeeper":  # "[<Node>:<Component>@<Id>]" is one bracket to the detector
            assert len(s.fields) == len(re.findall(r"<(?!Content)", header)), (name, s.header)


def test_generic_masks_name_value_shapes():
    fmt = LogFormat("generic")  # no masks given: the generic defaults
    assert fmt.masks == DEFAULT_MASKS and PRESETS["hdfs"].masks == HDFS_MASKS
    masker = LineParser(fmt, None).miner.masker
    cases = {
        "connection from 1.2.3.4 () at Sun Jul 10 12:34:56 2005": "connection from <IP> () at <DATETIME>",
        "peers 10.0.0.1,10.0.0.2:80 up": "peers <IP> up",
        "GET https://x.org/a?b=1 and /v2/items?limit=5": "GET <URL> and <PATH>",
        "mail bob.smith@example.com at 2017-05-16 00:00:00.008": "mail <EMAIL> at <DATETIME>",
        "stored 384.0 B free 12 KB": "stored <SIZE> free <SIZE>",
        "loaded v6.1.7601.23505 token 9f4ef63 ok": "loaded <VERSION> token <HEX> ok",
        "deleting blk_-12 blk_34 blk_56 now": "deleting blk_<ID> now",  # the prefix stays (keep group)
        "attempt_1445_0020_m_000000_0 done": "attempt_<ID> done",
        "proxy.example.edu:5070 open after 12:00:01 on 2005.06.03": "<HOST> open after <TIME> on <DATE>",
        "took 17 steps, id 0x1f": "took <NUM> steps, id <HEX>",
    }
    for text, masked in cases.items():
        assert masker.mask(text) == masked, text


def test_parsing_accuracy_hand_checked():
    assert normalize_template("Took <NUM> seconds  to <*>") == "Took <*> seconds to <*>"
    assert normalize_template("Took <*>.<*> seconds to <*>") == "Took <*> seconds to <*>"
    assert normalize_template("<*>:<*> open, <*>,<*> peers") == "<*> open, <*> peers"
    truth = ["Took <*>.<*> seconds", "user <*> logged in", "blk_<*> served"]
    assert parsing_accuracy(truth, ["Took <NUM> seconds", "user <*> logged in", "<ID> served"]) == pytest.approx(2 / 3)
    assert parsing_accuracy(truth, [None, None, None]) == 0.0
    with pytest.raises(ValueError):
        parsing_accuracy(truth, ["x"])


def test_bench_parse_with_header_formats_and_detected_headers(tmp_path):
    """Issue 49's goal on the twelve shared systems (two roots): with header-only formats and with
    detected headers, mean GA >= 0.93 and no system more than 0.02 below published Drain;
    leave-one-system-out mean GA >= 0.90; mean PA >= 0.70; the presets keep their figures."""
    formats = tmp_path / "headers.json"
    formats.write_text(json.dumps({"formats": {k: {"header": h} for k, h in HEADERS.items()} | MORE_FORMATS}))
    out = tmp_path / "parse.json"
    assert main(["bench", "parse", "--loghub", str(require(LOGHUB)), "--loghub", str(require(LOGHUB_MORE)),
                 "--json", str(out), "--formats", str(formats), "--auto-header"]) == 0
    result = json.loads(out.read_text())
    assert len(result["datasets"]) == 12
    for name, d in result["datasets"].items():
        assert {"ga", "pa", "ga_auto", "ga_loso", "ga_drain3_default", "format", "auto_header"} <= set(d), name
        assert d["parsed_with"] == "format" and d["format"] == name.lower() and d["header_rejects"] == 0
        assert d["ga"] >= PUBLISHED_DRAIN_GA[name] - 0.02 and d["ga_auto"] >= PUBLISHED_DRAIN_GA[name] - 0.02, name
        assert 0.0 <= d["pa"] <= 1.0
    assert result["mean_ga"] >= 0.93 and result["mean_ga_auto"] >= 0.93
    assert result["mean_ga_loso"] >= 0.90 and result["mean_pa"] >= 0.70
    assert result["loso"]["defaults_are_best"] and len(result["loso"]["datasets"]) == 12
    # the left-out choice is the defaults for most systems: there ga_loso == ga
    same = [n for n, c in result["loso"]["chosen_without"].items() if c == result["loso"]["best_on_all"]]
    assert len(same) >= 8 and all(result["datasets"][n]["ga_loso"] == result["datasets"][n]["ga"] for n in same)
    assert result["mean_ga_preset"] == pytest.approx(0.910, abs=5e-4)  # the presets' figures stay
    assert result["mean_pa"] == result["mean_pa_format"] and result["mean_ga"] == result["mean_ga_format"]
    table = out.with_suffix(".md").read_text()
    assert "given header + default masks" in table and "leave-one-system-out" in table and "**PA**" in table
    with pytest.raises(SystemExit, match="under two roots"):
        main(["bench", "parse", "--loghub", str(LOGHUB), "--loghub", str(LOGHUB), "--json", str(out)])


def test_bench_parse_detects_where_nothing_else_parses(tmp_path):
    """A folder named like no preset and no format is parsed with a detected header (``"auto"``)
    with --auto-header, and skipped without it."""
    src = next(p for p in require(LOGHUB).iterdir() if p.name == "Spark")
    dst = tmp_path / "loghub" / "Sparkly"
    dst.mkdir(parents=True)
    (dst / "Sparkly_2k.log").write_text((src / "Spark_2k.log").read_text())
    (dst / "Sparkly_2k.log_structured.csv").write_text((src / "Spark_2k.log_structured.csv").read_text())
    out = tmp_path / "p.json"
    assert main(["bench", "parse", "--loghub", str(tmp_path / "loghub"), "--json", str(out), "--auto-header"]) == 0
    d = json.loads(out.read_text())["datasets"]["Sparkly"]
    assert d["format"] == "auto" and d["parsed_with"] == "auto" and "preset" not in d
    assert d["ga"] == d["ga_auto"] >= 0.9
    with pytest.raises(SystemExit, match="no dataset"):
        main(["bench", "parse", "--loghub", str(tmp_path / "loghub"), "--json", str(out)])


def test_logformat_suggest_cli(tmp_path, capsys):
    rng = random.Random(2)
    log = tmp_path / "my-app.log"
    make, expected = SHAPES["iso-z"]
    log.write_text("\n".join(make(rng, i) for i in range(200)) + "\n")
    assert main(["logformat", "suggest", str(log)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == expected
    spec = tmp_path / "formats.json"
    spec.write_text(out[1])
    fmt = load_formats(spec)["my_app"]
    assert fmt.header == expected and fmt.ts_format == "%Y-%m-%dT%H:%M:%S.%fZ"
    with pytest.raises(SystemExit, match="no log file"):
        main(["logformat", "suggest", str(tmp_path / "missing.log")])


def test_ingest_auto_header_end_to_end(tmp_path, capsys):
    """An unseen layout through the CLI: the header is detected, kept for the source, and its
    fields become keys; a later file of the source splits the same way."""
    rng = random.Random(3)
    make, expected = SHAPES["iso-z"]
    first, second = tmp_path / "app-1.log", tmp_path / "app-2.log"
    first.write_text("\n".join(make(rng, i) for i in range(120)) + "\n")
    # the second file alone would read differently (one level only): the source keeps its header
    second.write_text("\n".join(f"2023-05-02T10:00:{i % 60:02d}.5Z [worker-1] INFO c.e.Svc - {_content(rng)}"
                                for i in range(30)) + "\n")
    root = tmp_path / "root"
    with pytest.raises(SystemExit, match="--auto-header"):
        main(["ingest", "logs", str(first), "--root", str(root), "--source", "myapp"])
    assert main(["ingest", "logs", str(first), "--root", str(root), "--source", "myapp", "--auto-header"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["format"] == "auto" and report["header"] == expected
    assert report["read"] == report["parsed"] == 120 and report["rejected"] == 0
    saved = json.loads((root / "state" / "format-myapp.json").read_text())
    assert saved["header"] == expected
    assert main(["ingest", "logs", str(second), "--root", str(root), "--source", "myapp", "--auto-header"]) == 0
    assert json.loads(capsys.readouterr().out)["header"] == expected
    objects = pl.read_parquet(root / "objects" / "source=myapp" / "**" / "*.parquet")
    assert objects.select("sequence_id", "step").unique().height == 150  # one object a line
    assert {"level", "context", "field"} <= set(objects["key"].unique())  # header fields are keys
    assert set(objects.filter(pl.col("key") == "level")["value"]) <= {"INFO", "WARN"}


def test_catalogue_log_sources_take_a_format_named_like_them_or_detect_one(tmp_path, capsys):
    rng = random.Random(4)
    make, expected = SHAPES["comma-level"]
    log = tmp_path / "win.log"
    log.write_text("\n".join(make(rng, i) for i in range(80)) + "\n")
    formats = tmp_path / "formats.json"
    formats.write_text(json.dumps({"formats": {"winlog": {"header": "<Date> <Time>, <Level> <Content>", "ts_fields": ["Date", "Time"],
                                                  "ts_format": "%Y-%m-%d %H:%M:%S"}}}))
    catalog = tmp_path / "seqenc.toml"
    catalog.write_text('[sources.winlog]\nkind = "logs"\nformats = "formats.json"\n\n'
                       '[sources.winauto]\nkind = "logs"\nauto_header = true\n')
    for source, fmt in (("winlog", "winlog"), ("winauto", "auto")):
        assert main(["ingest", "logs", str(log), "--root", str(tmp_path / "root"), "--source", source,
                     "--catalog", str(catalog)]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["format"] == fmt and report["header"] == expected and report["rejected"] == 0
    catalog.write_text('[sources.ev]\nkind = "events"\nauto_header = true\n')
    with pytest.raises(SystemExit, match="auto_header"):
        main(["ingest", "events", str(log), "--root", str(tmp_path / "root"), "--source", "ev",
              "--catalog", str(catalog)])
