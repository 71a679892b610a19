"""Reading an input file line by line, with bad input as rejects (parsers.storage re-exports it).

Every ingest (logs, events, tables' texts) reads through :class:`LineReader`: blocks of the file
are decoded and split in one polars call, and what cannot be read becomes a reject record
(line number, reason, raw text cut to ``RAW_LIMIT``), never an error and never a silent loss.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Iterator
from pathlib import Path

import polars as pl

#: Rejected raw text is cut to this many characters (the contract says 1 KiB).
RAW_LIMIT = 1024


def open_input(path: str | os.PathLike):
    """Binary line reader of an input file; ``.gz`` files are decompressed on the fly."""
    path = Path(path)
    return gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb")


MAX_LINE_BYTES = 64 * 1024


class LineReader:
    """Decoded, non-blank lines of an input file (``.gz`` too), with 1-based line numbers.

    Bad input becomes rejects (line number, reason, raw text), never an error and never a
    silent loss: undecodable bytes, lines over ``max_line_bytes`` (64 KiB), an empty gzip file,
    a truncated or corrupt gzip stream (the lines before the damage are kept). ``read`` and
    ``blank`` count what was seen.

    The file is read in blocks of about ``block_bytes`` that end at a line end; a block is
    decoded and split in one call each and checked column-wise (polars), so reading is not a
    Python loop per line. A block with undecodable bytes is checked line by line instead. A line
    longer than the block is skipped while it is read, so memory stays bounded by the block.
    """

    def __init__(self, path: str | os.PathLike, rejects: list[tuple[int, str, str]],
                 max_line_bytes: int = MAX_LINE_BYTES, block_bytes: int = 16 << 20):
        self.path, self.rejects, self.max_line_bytes = Path(path), rejects, max_line_bytes
        self.block_bytes = max(block_bytes, max_line_bytes + 1)
        self.piece_bytes = min(1 << 20, self.block_bytes)  # one read call
        self.read = self.blank = 0

    def frames(self, size: int) -> Iterator[pl.DataFrame]:
        """Good lines as frames ``line_no, text`` of ``size`` lines (the last: fewer)."""
        pending = pl.DataFrame(schema={"line_no": pl.Int64, "text": pl.String})
        for block in self._blocks():
            pending = pl.concat([pending, self._lines(block)])
            while pending.height >= size:
                yield pending.head(size)
                pending = pending.slice(size)
        if pending.height:
            yield pending
        if self.read == 0 and self.path.suffix == ".gz":
            self.rejects.append((0, "empty gzip file", ""))

    def __iter__(self) -> Iterator[tuple[int, str]]:
        for frame in self.frames(1 << 16):
            yield from zip(frame["line_no"].to_list(), frame["text"].to_list())

    def _blocks(self) -> Iterator[bytes]:
        """The raw file in pieces that end at a line end (the last piece: maybe not)."""
        buf, n = [], 0
        with open_input(self.path) as fh:
            try:
                while piece := fh.read1(self.piece_bytes):
                    buf.append(piece)
                    n += len(piece)
                    if n < self.block_bytes:
                        continue
                    data = b"".join(buf)
                    cut = data.rfind(b"\n") + 1
                    if cut:
                        yield data[:cut]
                        buf, n = [data[cut:]], len(data) - cut
                    else:  # one line fills the whole block: reject it, skip to its end
                        buf = [self._skip_line(fh, data)]
                        n = len(buf[0])
            except (EOFError, gzip.BadGzipFile, OSError) as exc:
                data = b"".join(buf)
                cut = data.rfind(b"\n") + 1
                if cut:
                    yield data[:cut]
                buf = []  # the cut-off last line is the reject's raw text
                self.rejects.append((self.read + 1, f"truncated or corrupt gzip: {exc}",
                                     data[cut:][:RAW_LIMIT].decode("utf-8", "replace")))
        if buf and (data := b"".join(buf)):
            yield data

    def _skip_line(self, fh, head: bytes) -> bytes:
        """Read past the end of an over-long line; return what follows it."""
        self.read += 1
        self.rejects.append((self.read, f"line longer than {self.max_line_bytes} bytes",
                             head[:RAW_LIMIT].decode("utf-8", "replace")))
        while piece := fh.read1(self.piece_bytes):
            end = piece.find(b"\n")
            if end >= 0:
                return piece[end + 1:]
        return b""

    def _lines(self, block: bytes) -> pl.DataFrame:
        """One block -> its good lines; counts and rejects the rest."""
        first = self.read + 1
        body = block[:-1] if block.endswith(b"\n") else block
        try:  # decoded and split in one call each: no Python object per line
            lines = pl.LazyFrame({"text": [body.decode("utf-8")]}).select(pl.col("text").str.split("\n").explode())
            lines = lines.with_columns(raw_bytes=pl.col("text").str.len_bytes())
        except UnicodeDecodeError:
            raw = body.split(b"\n")
            lines = pl.LazyFrame({"text": pl.Series([self._decode(first + i, line) for i, line in enumerate(raw)],
                                                    dtype=pl.String),
                                  "raw_bytes": pl.Series([len(line) for line in raw], dtype=pl.UInt32)})
        text = pl.col("text").str.strip_chars_end("\r")
        frame = lines.select(line_no=pl.int_range(pl.len(), dtype=pl.Int64) + first, text=text,
                             too_long=pl.col("raw_bytes") > self.max_line_bytes,
                             blank=text.str.strip_chars().str.len_bytes() == 0).collect()
        self.read += frame.height
        if frame["too_long"].any():
            too_long = frame.filter("too_long")
            for n, line in zip(too_long["line_no"].to_list(), too_long["text"].str.slice(0, RAW_LIMIT).to_list()):
                self.rejects.append((n, f"line longer than {self.max_line_bytes} bytes", line))
        self.blank += int((frame["blank"] & ~frame["too_long"]).sum())
        return frame.filter(~pl.col("too_long"), ~pl.col("blank"), pl.col("text").is_not_null()).select("line_no", "text")

    def _decode(self, line_no: int, line: bytes) -> str | None:
        """A line of a block with bad bytes: its text, or None and an ``undecodable`` reject.
        (An over-long line is only rejected for its length.)"""
        try:
            return line.decode("utf-8")
        except UnicodeDecodeError as exc:
            if len(line) > self.max_line_bytes:
                return line[:RAW_LIMIT].decode("utf-8", "replace")
            self.rejects.append((line_no, f"undecodable: {exc.reason} at byte {exc.start}",
                                 line.rstrip(b"\r").decode("utf-8", "replace")))
            return None
