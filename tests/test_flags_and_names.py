"""Issue 50, item 6: one reader of yes/no flags (CI), and user names checked whole."""

import pytest
from shared_data import env_flag, in_ci

from parsers.names import UnsafeName, check_name


def test_one_reader_of_yes_no_flags(monkeypatch):
    for value, expected in (("true", True), ("1", True), ("YES", True), (" on ", True), ("false", False),
                            ("0", False), ("no", False), ("", False)):
        monkeypatch.setenv("SEQENC_TEST_FLAG", value)
        assert env_flag("SEQENC_TEST_FLAG") is expected, value
    monkeypatch.delenv("SEQENC_TEST_FLAG")
    assert env_flag("SEQENC_TEST_FLAG") is False
    monkeypatch.setenv("SEQENC_TEST_FLAG", "maybe")
    with pytest.raises(ValueError, match="SEQENC_TEST_FLAG='maybe' is not a yes/no flag"):
        env_flag("SEQENC_TEST_FLAG")
    monkeypatch.setenv("CI", "yes")  # the deepspeed tests and the shared-data check read it the same way
    assert in_ci()


def test_names_are_checked_whole():
    assert check_name("hdfs_2.logs-v1") == "hdfs_2.logs-v1"
    for bad in ("hdfs\n", "a\nb", "../x", "/etc", ".hidden", "a/b", "", "x" * 65, None, "a\x00"):
        with pytest.raises(UnsafeName):
            check_name(bad)


def test_no_other_reader_of_the_ci_flag():
    """Every test and module reads ``CI`` through :func:`env_flag` (a second reader once took only
    exactly "true", so ``CI=1`` skipped the Celery cluster's tests in one place and not the other)."""
    import re
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    direct = re.compile(r"""(environ\.get|environ\[|getenv)\(?\s*["']CI["']""")
    readers = [str(p.relative_to(root)) for folder in ("seqenc", "parsers", "training", "dags", "tests")
               for p in sorted((root / folder).rglob("*.py"))
               if p.name != "shared_data.py" and direct.search(p.read_text(encoding="utf-8"))]
    assert readers == []
