"""Column-at-a-time versions of the per-line steps of log ingestion (polars, Rust regex).

Ingestion handles lines in batches; header splitting, masking, id extraction and parameter
extraction run as polars string expressions over a whole batch instead of Python code per line.
Only what is new goes through Python: distinct masked contents to Drain3, distinct timestamps to
``strptime``, and the few lines whose parameters the template regex does not match (they fall
back to Drain3's own ``extract_parameters``).

The masks are written without look-arounds (see parsers.presets), so Python's ``re`` (Drain3's
masker, used by ``LineParser``) and the Rust regex engine mask identically; a test checks it on
every LogHub file for every preset.
"""

from __future__ import annotations

import re
from functools import lru_cache

import polars as pl

from parsers.presets import KEEP, LogFormat, value_pattern

_SLOT = re.compile(r"(<[A-Z][A-Z0-9_]*>|<\*>)")


_CONTENT_LAST = ("(?P<Content>.*)$", "(?P<Content>.*?)$")


def split_headers(frame: pl.LazyFrame, fmt: LogFormat) -> pl.LazyFrame:
    """Raw lines (column ``text``) -> plus one column per header field and ``Content``
    (stripped); all null where the line does not match the header pattern.

    When ``Content`` is the pattern's last group and takes the rest of the line (every preset),
    only the header *prefix* is matched with captures -- the capture engine then runs on a few
    dozen characters instead of the whole line -- and ``Content`` is the text after the
    prefix. The result is the same: ``.*$`` matches any rest of a line, so the prefix's first
    match is the whole pattern's.
    """
    pattern = fmt.regex().pattern
    text = pl.col("text")
    prefix = next((pattern[: -len(end)] for end in _CONTENT_LAST if pattern.endswith(end)), None)
    if prefix is None:
        return frame.with_columns(text.str.extract_groups(pattern).struct.unnest()).with_columns(
            pl.col("Content").str.strip_chars())
    matched = text.str.contains(prefix)
    content = pl.when(matched).then(text.str.replace(prefix, "").str.strip_chars())
    fields = [text.str.extract_groups(prefix).struct.unnest()] if fmt.fields else []
    return frame.with_columns(*fields, Content=content)


def mask(content: pl.Expr, fmt: LogFormat) -> pl.Expr:
    """The content with every mask applied in order (what Drain3's masker does per line)."""
    for pattern, name in fmt.masks:  # a keep group's text stays before the token: ${keep} (parsers.presets)
        content = content.str.replace_all(pattern, ("${keep}" if KEEP in pattern else "") + f"<{name}>")
    return content


@lru_cache(maxsize=4096)
def template_regex(template: str, masks: tuple[tuple[str, str], ...]) -> tuple[str, tuple[str, ...]]:
    """A regex that matches the original content of a line of ``template`` and captures its
    slots as groups ``p0, p1, ...``: a mask slot with the mask's own pattern, a Drain wildcard
    ``<*>`` lazily; the spaces between template tokens match any whitespace run."""
    by_name: dict[str, str] = {}  # masks sharing a name (two DATETIME layouts): either of them
    for pattern, name in masks:
        value = value_pattern(pattern)
        by_name[name] = f"{by_name[name]}|(?:{value})" if name in by_name else f"(?:{value})"
    parts, names = [], []
    for i, piece in enumerate(_SLOT.split(template)):
        if i % 2:  # a slot
            name = piece[1:-1]
            pattern = by_name.get(name, ".*?") if name != "*" else ".*?"
            parts.append(f"(?P<p{len(names)}>{pattern})")
            names.append(name)
        else:
            parts.append(r"\s+".join(re.escape(p) for p in piece.split(" ")))
    return "^" + "".join(parts) + "$", tuple(names)


def extract_slots(content: pl.Series, template: str, masks) -> tuple[pl.DataFrame, tuple[str, ...]]:
    """Slot values of lines of one template: [len(content), n_slots] strings (null row = no match)."""
    pattern, names = template_regex(template, tuple(masks))
    if not names:
        return pl.DataFrame({"_matched": content.str.contains(pattern)}), names
    frame = content.str.extract_groups(pattern).struct.unnest()
    return frame.select([f"p{i}" for i in range(len(names))]), names
