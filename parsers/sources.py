"""``[sources.<name>]`` of the catalogue: where raw data comes from and how it becomes objects.

Ingestion reads only this part of the catalogue (training.tasks.catalog holds the whole file and
its tasks). An entry point loads the catalogue once and passes it down as a
:class:`SourceCatalog`; ingestion never looks a catalogue up by itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from parsers.objectstore import S3Path

SOURCE_KINDS = ("logs", "events", "tables", "texts")
# the demo's data generators (training.pipeline.stages.stage_generate), by what they write
DEMO_GENERATORS = ("hdfs_logs", "session_events", "purchases")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Source(_Strict):
    """``[sources.<name>]``: where raw data comes from and how it becomes sequences."""

    kind: Literal[SOURCE_KINDS]  # type: ignore[valid-type]
    path: str | None = None  # file, glob or folder of raw files (the landing DAG watches <landing>/<name>/)
    # logs: a parsers.presets name or a name in `formats` (a JSON of user formats)
    preset: str | None = None
    formats: str | None = None
    # logs with neither: detect the header from the file's first lines (parsers.header_detect)
    auto_header: bool = False
    # logs: sequences by the ids this regex finds in the content (default: the preset's), or by
    # `session_field` (a header field) and time windows of `window` seconds every `step` seconds
    session_id: str | None = None
    window: float | None = Field(default=None, gt=0)
    step: float | None = Field(default=None, gt=0)
    # events: the field (dotted for nested objects) whose value is the sequence id, and the time field
    session_field: str | None = None
    ts_field: str | None = None
    # tables (parsers.tables): a table file is one sequence, its rows the objects, its columns the
    # keys; the delimiter is sniffed from the first lines unless given (TabFact: "#")
    delimiter: str | None = Field(default=None, min_length=1, max_length=1)
    # texts (parsers.tables): the record field holding the text, its id field (default: file:line),
    # how the text is cut into objects, and a field holding the record's label (kept out of the objects)
    text_field: str | None = None
    id_field: str | None = None
    text_units: Literal["none", "sentences", "lines"] | None = None
    label_field: str | None = None
    labels: str | None = None  # a labels CSV with a header row
    label_id_column: str | None = None
    label_column: str | None = None
    max_reject_share: float = Field(default=0.1, ge=0, le=1)
    demo_generator: Literal[DEMO_GENERATORS] | None = None  # type: ignore[valid-type]

    @model_validator(mode="after")
    def _by_kind(self) -> Source:
        if self.kind == "logs" and self.ts_field:
            raise ValueError("ts_field is for events; log times come from the log format")
        if self.kind == "events" and (self.preset or self.formats or self.auto_header or self.session_id
                                      or self.window):
            raise ValueError("preset, formats, auto_header, session_id and window are for logs; events use "
                             "session_field and ts_field")
        if self.window is None and self.step is not None:
            raise ValueError("step needs window")
        if self.kind in ("tables", "texts") and (self.preset or self.formats or self.auto_header or self.session_id
                                                  or self.window or self.session_field or self.ts_field):
            raise ValueError(f"preset, formats, auto_header, session_id, window, session_field and ts_field are "
                             f"for logs and events; a {self.kind} source has none")
        if self.delimiter is not None and self.kind != "tables":
            raise ValueError("delimiter is for tables")
        if self.kind != "texts" and any((self.text_field, self.id_field, self.text_units, self.label_field)):
            raise ValueError("text_field, id_field, text_units and label_field are for texts")
        return self

    def table_options(self) -> dict:
        """Keyword arguments of parsers.tables.ingest_table."""
        return {"delimiter": self.delimiter, "max_reject_share": self.max_reject_share}

    def text_options(self) -> dict:
        """Keyword arguments of parsers.tables.ingest_text."""
        return {"text_field": self.text_field or "text", "id_field": self.id_field,
                "units": self.text_units or "none", "label_field": self.label_field,
                "max_reject_share": self.max_reject_share}

    def event_options(self) -> dict:
        """Keyword arguments of parsers.events.ingest_events."""
        return {"session_field": self.session_field or "session_id", "ts_field": self.ts_field or "ts",
                "max_reject_share": self.max_reject_share}


class SourceCatalog(Protocol):
    """What ingestion needs of a loaded catalogue (training.tasks.catalog.Catalog is one)."""

    sources: Mapping[str, Source]

    def resolve_path(self, path: str) -> Path | S3Path: ...  # s3:// paths resolve to parsers.objectstore.S3Path
