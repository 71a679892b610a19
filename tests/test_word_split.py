"""Issue 49's parsing rules on lines written here: token shapes (parsers.drain), word splits
(parsers.word_split), masks that keep an id's prefix (parsers.presets.KEEP), and that ingest --
serial, parallel, and continued from a saved state -- gives the events the bench scores."""

import json
import random
from pathlib import Path

import polars as pl
import pytest

from parsers import columns, storage
from parsers.drain import fits, merge_tokens
from parsers.log_ingest import ingest_logs
from parsers.logs import LineParser, events_of, make_miner
from parsers.parallel_ingest import merge_mined, mine_file, write_file
from parsers.presets import ID_LIST, PRESETS, LogFormat, value_pattern
from parsers.word_split import WordSplit, is_word
from training.bench.parse import grouping_accuracy, our_parse

DAY = "2025-01-01"
FMT = LogFormat("app", header="<Date> <Time> <Level> <Content>", ts_fields=("Date", "Time"),
                ts_format="%Y-%m-%d %H:%M:%S")


def ssh_lines(n: int = 300, seed: int = 0) -> tuple[list[str], list[str]]:
    """Raw lines of three events and their true event names: a login failure whose method is
    ``password`` or ``none`` (two events: LogHub's OpenSSH splits them) for many user names
    (values), and a session close for many users."""
    rng = random.Random(seed)
    users = [f"{a}{b}" for a in ("ad", "ro", "te", "or", "gu") for b in ("min", "ot", "st", "acle", "est")]
    lines, truth = [], []
    for i in range(n):
        stamp = f"2025-01-01 10:{i // 60:02d}:{i % 60:02d}"
        user, port = rng.choice(users), rng.randint(1024, 65000)
        kind = rng.random()
        if kind < 0.45:
            method = "password" if rng.random() < 0.8 else "none"
            lines.append(f"{stamp} INFO Failed {method} for invalid user {user} from 10.0.{i % 7}.{i % 250} port "
                         f"{port} ssh2")
            truth.append(f"failed-{method}")
        else:
            lines.append(f"{stamp} INFO session closed for user {user} after {rng.randint(1, 99)} s")
            truth.append("closed")
    return lines, truth


def test_a_few_words_split_a_template_and_many_stay_a_value():
    lines, truth = ssh_lines()
    groups, templates = our_parse(lines, FMT)
    assert grouping_accuracy(truth, groups) == 1.0
    by_truth = {t: tpl for t, tpl in zip(truth, templates)}
    assert by_truth["failed-password"].startswith("Failed password for invalid user <*> from <IP>")
    assert by_truth["failed-none"].startswith("Failed none for invalid user <*>")
    assert by_truth["closed"] == "session closed for user <*> after <NUM> s"
    # without the splits Drain merges the two methods into one template
    plain, _ = our_parse(lines, LogFormat("app", header=FMT.header, split_words=0))
    assert grouping_accuracy(truth, plain) < 1.0
    assert len({g for g, t in zip(plain, truth) if t.startswith("failed")}) == 1


def test_word_split_rules():
    assert is_word("password") and is_word("overlap:false") and is_word("TIME_TICK") and is_word("failures;")
    assert not is_word("user42") and not is_word("rhost=<IP>") and not is_word("(x)") and not is_word("3")
    split = WordSplit(2)
    template = ("layout", "<*>", "at", "<*>")
    for tokens in (("layout", "begin", "at", "x1"), ("layout", "end", "at", "y"), ("layout", "end", "at", "z")):
        split.observe(7, tokens)
    assert split.split_positions(7, template) == (1,)  # position 3 held a digit: a value
    ids = iter(range(100, 200))
    assert split.event(7, template, ("layout", "end", "at", "q"), lambda: next(ids)) == \
        (100, ("layout", "end", "at", "<*>"))
    assert split.event(7, template, ("layout", "begin", "at", "q"), lambda: next(ids))[0] == 101
    assert split.event(7, template, ("layout", "end", "at", "w"), lambda: next(ids))[0] == 100  # known: same id
    split.observe(7, ("layout", "middle", "at", "q"))  # a third word: more than 2, a value for good
    assert split.split_positions(7, template) == ()
    assert WordSplit(0).split_positions(7, template) == ()
    with pytest.raises(ValueError, match="split_words"):
        WordSplit(-1)


def test_token_shapes_merge_lines_whose_masked_values_differ_in_kind():
    """Eight ``key=<value>`` tokens: without shapes a line joins only a template equal to it, so
    which values happened to be hex splits one event in many."""
    rng = random.Random(1)
    lines = [f"2025-01-01 10:00:{i % 60:02d} INFO setVisibility " +
             " ".join(f"{k}={rng.choice(['0x1f', '0x3a', str(rng.randint(0, 9))])}" for k in "abcdefgh")
             for i in range(60)]
    shaped, templates = our_parse(lines, FMT)
    assert len(set(shaped)) == 1 and templates[0] == "setVisibility " + " ".join(f"{k}=<*>" for k in "abcdefgh")
    plain, _ = our_parse(lines, LogFormat("app", header=FMT.header, mask_shapes=False))
    assert len(set(plain)) > 10


def test_merged_tokens_keep_their_shared_edges():
    assert merge_tokens("rhost=<IP>", "rhost=host.example.org") == "rhost=<*>"
    assert merge_tokens("(a.example.org)", "()") == "(<*>)"
    assert merge_tokens("tty=NODEVssh", "tty=:0") == "tty=<*>"
    assert merge_tokens("begin", "end") == "<*>"
    assert merge_tokens("vis=<NUM>", "vis=<HEX>") == "vis=<*>"
    # a huge token is compared by equal shape only (no slow wildcard match)
    assert fits("a<*>b<*>", "a1b2") and not fits("a<*>b<*>c<*>d<*>", "a" * 5000 + "x")


def test_an_id_mask_keeps_its_prefix_in_python_and_in_polars():
    fmt = LogFormat("generic")
    texts = ["Deleting block blk_-42 file /a/b/blk_7", "Progress of TaskAttempt attempt_1445_0020_m_000000_0 is : 0.5",
             "ask 10.0.0.1:50010 to delete blk_1 blk_2 blk_3", "lease for [DFSClient_NONMAPREDUCE_1537864556_1] ok"]
    python = [make_miner(fmt, None).masker.mask(t) for t in texts]
    assert python[0] == "Deleting block blk_<ID> file <PATH>" and python[1].startswith("Progress of TaskAttempt attempt_<ID>")
    assert python[2] == "ask <IP> to delete blk_<ID>" and python[3] == "lease for [DFSClient_NONMAPREDUCE_<ID>] ok"
    rust = pl.DataFrame({"c": texts}).select(columns.mask(pl.col("c"), fmt)).to_series().to_list()
    assert rust == python
    assert value_pattern(ID_LIST[0]).startswith("-?\\d") and value_pattern(r"\bx(y)") == r"\bx(y)"
    # the slot holds the value without the prefix, which is in the template
    frame, names = columns.extract_slots(pl.Series(["Verification succeeded for blk_-42"]),
                                         "Verification succeeded for blk_<ID>", fmt.masks)
    assert names == ("ID",) and frame.row(0) == ("-42",)


def test_presets_keep_plain_drain():
    for fmt in PRESETS.values():
        assert (fmt.mask_shapes, fmt.split_words) == (False, 0), fmt.name
    assert (LogFormat("x").mask_shapes, LogFormat("x").split_words) == (True, 3)


def _events_by_line(root: Path) -> list[tuple]:
    frame = pl.concat([pl.read_parquet(p) for p in sorted((root / "objects").rglob("part-*.parquet"))])
    return frame.filter(pl.col("key") == "template").select("sequence_id", "step", "template_id", "value").rows()


def _write(lines: list[str], folder: Path, n: int) -> list[Path]:
    folder.mkdir(parents=True)
    per = -(-len(lines) // n)
    paths = []
    for i in range(n):
        path = folder / f"part-{i}.log"
        path.write_text("".join(line + "\n" for line in lines[i * per:(i + 1) * per]))
        paths.append(path)
    return paths


def test_ingest_gives_the_bench_events_serial_parallel_and_resumed(tmp_path):
    lines, truth = ssh_lines(240)
    paths = _write(lines, tmp_path / "in", 3)
    for p in paths:  # serial, file after file, one state
        ingest_logs(p, tmp_path / "serial", source="s", preset=FMT, ingest_date=DAY)
    for p in paths:  # the parallel algorithm's three steps, in this process
        mine_file(p, tmp_path / "par", "s", FMT, DAY)
    merge_mined([(p, DAY) for p in paths], tmp_path / "par", "s", FMT)
    for p in paths:
        write_file(p, tmp_path / "par", "s", FMT, DAY)
    serial = _events_by_line(tmp_path / "serial")
    assert [r[:3] for r in serial] == [r[:3] for r in _events_by_line(tmp_path / "par")]
    methods = {r[3].split()[1] for r in serial if r[3].startswith("Failed")}
    assert methods == {"password", "none"}  # the split reached the objects' template text
    ids = {r[3].split()[1]: r[2] for r in serial if r[3].startswith("Failed")}
    assert ids["password"] != ids["none"]

    state = json.loads(storage.drain_state_path(tmp_path / "serial", "s").read_text())
    assert state["word_split"]["max_words"] == 3 and state["word_split"]["events"]
    # a re-run of the first file continues the saved state: the same event ids
    again = LineParser(FMT, storage.drain_state_path(tmp_path / "serial", "s"))
    contents = {}
    for line in lines[:80]:
        parsed = again.parse(line)
        contents.setdefault(parsed.masked, parsed.cluster)
    events = events_of(again.miner, contents)
    assert {t.split()[1]: e for e, t in events.values() if t.startswith("Failed")} == ids


def test_a_bad_word_split_in_the_state_is_refused(tmp_path):
    lines, _ = ssh_lines(60)
    ingest_logs(_write(lines, tmp_path / "in", 1)[0], tmp_path / "d", source="s", preset=FMT, ingest_date=DAY)
    path = storage.drain_state_path(tmp_path / "d", "s")
    state = json.loads(path.read_text())
    state["word_split"]["events"] = [["1", ["x"], 5]]
    path.write_text(json.dumps(state))
    with pytest.raises(ValueError, match="word_split.events is not valid"):
        LineParser(FMT, path)


def test_header_detection_reads_clocks_without_leading_zeros():
    from parsers.header_detect import suggest_header

    rng = random.Random(3)
    messages = ["onStandStepChanged 3579", "onExtend:1514038530000 14 0 4", "REPORT : 7007 5002 150089 240",
                "flush sensor data", "processHandleBroadcastAction action:android.intent.action.TIME_TICK"]
    lines = [f"20171223-{rng.randint(0, 23)}:{rng.randint(0, 59)}:{rng.randint(0, 59)}:{rng.randint(0, 999)}|Step_LSC|"
             f"3000{rng.randint(1000, 9999)}|{rng.choice(messages)}" for _ in range(200)]
    suggestion = suggest_header(lines)
    assert suggestion.header.startswith("<Timestamp>|") and suggestion.format_spec()["ts_format"] == "%Y%m%d-%H:%M:%S:%f"
    parser = LineParser(suggestion.log_format("app"), None)
    assert all(not isinstance(parser.parse(line), str) and parser.parse(line).ts is not None for line in lines)


def test_a_slot_whose_mask_name_two_masks_share_extracts_with_either():
    fmt = LogFormat("generic")  # DATETIME: a text layout and an ISO one
    template = "connection from <IP> (<*>) at <DATETIME>"
    frame, _ = columns.extract_slots(pl.Series(["connection from 10.0.0.1 () at Mon Jun 20 03:40:59 2005",
                                                "connection from 10.0.0.2 (a.org) at 2005-06-20 03:40:59"]),
                                     template, fmt.masks)
    assert frame.rows() == [("10.0.0.1", "", "Mon Jun 20 03:40:59 2005"), ("10.0.0.2", "a.org", "2005-06-20 03:40:59")]


def test_leave_one_out_scores_each_dataset_with_the_setting_chosen_on_the_others():
    from training.bench.parse_loso import leave_one_out, with_settings

    grid = {"split_words": (3, 6), "sim_th": (0.5,)}
    # a and b do best with split_words 6, c with 3 (the default, first in the grid; best on all three)
    table = {("a", 3): 0.8, ("a", 6): 0.9, ("b", 3): 0.7, ("b", 6): 0.8, ("c", 3): 1.0, ("c", 6): 0.5}
    data = {n: ([], LogFormat(n)) for n in "abc"}
    out = leave_one_out(data, lambda n, lines, fmt: table[(n, fmt.split_words)], grid)
    assert out["best_on_all"] == {"split_words": 3, "sim_th": 0.5} and out["defaults_are_best"]
    assert out["chosen_without"]["c"]["split_words"] == 6 and out["ga_loso"]["c"] == 0.5  # c's own best is not chosen
    assert out["chosen_without"]["a"]["split_words"] == 3  # b (0.8 vs 0.7) + c (1.0 vs 0.5): 3 wins without a
    assert out["ga_loso"] == {"a": 0.8, "b": 0.7, "c": 0.5}
    # a value the format sets itself is not the grid's to change
    assert with_settings(LogFormat("x", sim_th=0.7), {"sim_th": 0.4, "split_words": 6}).sim_th == 0.7
    assert with_settings(LogFormat("x", sim_th=0.7), {"sim_th": 0.4, "split_words": 6}).split_words == 6
