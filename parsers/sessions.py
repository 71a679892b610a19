"""Which sequence(s) a parsed log line belongs to.

Two ways, set per log format (``LogFormat.session``) or on the command line:

* **by id** (``SessionSpec(id_pattern=...)``): every distinct match of a regex in the content is a
  sequence id -- HDFS ``blk_-?\\d+``; a line naming two blocks belongs to both. A line naming
  none is counted (``no_sequence_id``), not rejected.
* **by field and time window** (``SessionSpec(field="Node", window_s=3600, step_s=...)``), for
  logs without a natural id (BGL, Thunderbird): lines are grouped by a header field (None: one
  stream) and by time window. ``step_s == window_s`` (default) gives fixed windows, each line in
  exactly one; ``step_s < window_s`` gives sliding windows, a line in every window that covers
  it (at most ``MAX_WINDOWS_PER_LINE``: a spec over it is refused with the count, where the
  windows were silently capped before). The sequence id is ``<field value>@<window start, ISO
  8601 UTC>``, to the second -- or to the microsecond where the step is not a whole number of
  seconds, so that windows shorter than a second never share an id (steps under ``MIN_STEP_S`` are
  refused). A line without a
  timestamp cannot be placed and is rejected with that reason.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from dataclasses import dataclass
from functools import cached_property

# sliding windows: a line joins window / step of them; more is a mistake (a tiny --step), refused
MAX_WINDOWS_PER_LINE = 1000
MIN_STEP_S = 0.001  # a window start is written to the microsecond: a shorter step is a mistake


@dataclass(frozen=True)
class SessionSpec:
    id_pattern: str | None = None
    field: str | None = None
    window_s: float | None = None
    step_s: float | None = None

    def __post_init__(self) -> None:
        if (self.id_pattern is None) == (self.window_s is None):
            raise ValueError("a session spec needs exactly one of id_pattern or window_s")
        if self.window_s is not None and self.window_s <= 0:
            raise ValueError(f"window_s={self.window_s} must be > 0")
        step = self.step_s if self.step_s is not None else self.window_s
        if step is not None and not 0 < step <= self.window_s:
            raise ValueError(f"step_s={self.step_s} must lie in (0, window_s]")
        if step is not None and step < MIN_STEP_S:
            raise ValueError(f"a window step of {step:g} s is under {MIN_STEP_S:g} s: use a longer window "
                             "(or step)")
        if step is not None and math.ceil(self.window_s / step) > MAX_WINDOWS_PER_LINE:
            raise ValueError(f"window {self.window_s:g} s every {step:g} s puts each line in "
                             f"{math.ceil(self.window_s / step)} windows; at most {MAX_WINDOWS_PER_LINE}: "
                             "use a larger step")
        if self.id_pattern:
            re.compile(self.id_pattern)

    @property
    def step(self) -> float:
        return self.step_s if self.step_s is not None else self.window_s

    @cached_property
    def _rx(self) -> re.Pattern:
        return re.compile(self.id_pattern)

    def describe(self) -> str:
        if self.id_pattern:
            return f"id /{self.id_pattern}/"
        kind = "fixed" if self.step == self.window_s else f"sliding every {self.step:g} s"
        return f"{self.field or 'all lines'} x {self.window_s:g} s windows ({kind})"

    def sequence_ids(self, groups: dict[str, str], content: str, ts: dt.datetime | None) -> list[str] | str:
        """The line's sequence ids (maybe none), or a reject reason."""
        if self.id_pattern:
            return list(dict.fromkeys(self._rx.findall(content)))
        if ts is None:
            return "no timestamp: cannot place the line in a time window"
        owner = groups.get(self.field, "") if self.field else "all"
        t = ts.replace(tzinfo=dt.UTC).timestamp() if ts.tzinfo is None else ts.timestamp()
        last = math.floor(t / self.step)  # the latest window starting at or before t
        first = math.floor((t - self.window_s) / self.step) + 1  # the earliest one still covering t
        return [f"{owner}@{self._start(k)}" for k in range(first, last + 1)]

    def _start(self, k: int) -> str:
        """Window ``k``'s start (``k * step`` seconds after the epoch), ISO 8601 UTC: to the second
        for a whole-second step (the ids of every earlier ingest), else to the microsecond."""
        if float(self.step).is_integer():
            return dt.datetime.fromtimestamp(k * int(self.step), dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        start = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=round(k * self.step * 1e6))
        return start.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
