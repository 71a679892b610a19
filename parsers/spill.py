"""What both ingests keep between their two passes: compact sequence rows and a disk spill.

Log and event ingestion read their input once in batches (pass 1), and write the objects
table once, batch by batch (pass 2). Between the passes they hold only

* :class:`SequenceRows`: one ``(line, sequence, time)`` row per sequence a line belongs to,
  sequence ids coded as integers in first-seen order (a few numbers per line), and
* :class:`Spill`: the batches' parsed lines, on disk (Arrow IPC, one file per batch, in a hidden
  temporary folder beside the output, removed afterwards),

so memory grows by a few bytes per line, not by the text of the input.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import polars as pl

NO_TS = np.iinfo(np.int64).max  # lines without a timestamp sort last in their sequence


def steps_in_sequences(seq: np.ndarray, ts: np.ndarray, line: np.ndarray) -> np.ndarray:
    """Position of every (line, sequence) row inside its sequence, by time then line number."""
    order = np.lexsort((line, ts, seq))
    sorted_seq = seq[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_seq)) + 1] if len(order) else np.zeros(0, np.int64)
    group_start = np.repeat(starts, np.diff(np.r_[starts, len(order)]))
    steps = np.empty(len(order), dtype=np.int64)
    steps[order] = np.arange(len(order)) - group_start
    return steps


class SequenceRows:
    """(line, sequence, time) rows collected batch by batch; then ``finish`` gives each its step."""

    def __init__(self):
        self.code: dict[str, int] = {}  # sequence id -> code, first seen first
        self._parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.frame: pl.DataFrame | None = None  # after finish(): line_no, seq, step, ts_us
        self.names: pl.Series | None = None  # after finish(): sequence id of each code

    def add(self, line_no: pl.Series, sequence_id: pl.Series, ts_us: pl.Series) -> np.ndarray:
        """One row per (line, sequence id); ``ts_us`` null = no timestamp. Returns the codes."""
        batch_ids = sequence_id.unique(maintain_order=True)
        codes = [self.code.setdefault(sid, len(self.code)) for sid in batch_ids.to_list()]
        codes = sequence_id.replace_strict(batch_ids, codes, return_dtype=pl.Int64).to_numpy()
        self._parts.append((line_no.to_numpy(), codes, ts_us.fill_null(NO_TS).to_numpy()))
        return codes

    def finish(self) -> None:
        """Steps for every row; rows sorted by line, a line's sequences in code order."""
        line, seq, ts = (np.concatenate([p[i] for p in self._parts]) if self._parts else np.zeros(0, np.int64)
                         for i in range(3))
        step = steps_in_sequences(seq, ts, line)
        order = np.lexsort((seq, line))
        self.frame = pl.DataFrame({"line_no": line[order], "seq": seq[order], "step": step[order],
                                   "ts_us": ts[order]})
        self._parts = []
        self.names = pl.Series("sequence_id", list(self.code), dtype=pl.String)

    def of_lines(self, line_no: pl.Series) -> pl.DataFrame:
        """The rows of a batch of lines (one slice: rows are in line order)."""
        lines = self.frame["line_no"].to_numpy()
        lo, hi = np.searchsorted(lines, [line_no.min(), line_no.max() + 1])
        return self.frame.slice(lo, hi - lo)

    def columns(self, rows: pl.DataFrame, repeat: np.ndarray | None = None) -> dict[str, pl.Series]:
        """``sequence_id, step, ts`` of ``rows`` (each row ``repeat[i]`` times), for the objects table."""
        seq, step, ts = (rows[c].to_numpy() for c in ("seq", "step", "ts_us"))
        if repeat is not None:
            seq, step, ts = np.repeat(seq, repeat), np.repeat(step, repeat), np.repeat(ts, repeat)
        return {"sequence_id": self.names.gather(seq), "step": pl.Series(step),
                "ts": pl.Series(ts).set(pl.Series(ts == NO_TS), None).cast(pl.Datetime("us"))}


class Spill:
    """Batches of parsed lines on disk between the passes (``with``: removed at the end)."""

    def __init__(self, beside: Path):
        """In a hidden folder beside the part ``beside`` (the same disk); for an object key
        (``s3://``, parsers.objectstore) in the local temp folder."""
        if isinstance(beside, Path):
            beside.parent.mkdir(parents=True, exist_ok=True)
            self._dir = tempfile.TemporaryDirectory(prefix=".ingest-", dir=beside.parent)
        else:
            self._dir = tempfile.TemporaryDirectory(prefix=".ingest-")
        self.n = 0

    def write(self, frame: pl.DataFrame) -> None:
        frame.write_ipc(Path(self._dir.name) / f"{self.n}.arrow", compression="uncompressed")
        self.n += 1

    def __iter__(self):
        for b in range(self.n):
            yield pl.read_ipc(Path(self._dir.name) / f"{b}.arrow")

    def __enter__(self) -> Spill:
        return self

    def __exit__(self, *exc) -> None:
        self._dir.cleanup()
