"""Readers of trace dump files: OTLP JSON lines, one OTLP JSON document, length-prefixed protobuf.

- JSON lines: the OpenTelemetry Collector file exporter's default, one ``{"resourceSpans":...}``
  per line;
- one OTLP JSON document (possibly pretty-printed over many lines);
- the file exporter's protobuf format: each message is a 4-byte big-endian length followed by a
  serialized ``ExportTraceServiceRequest``.
A gzip-compressed file of any of these is read transparently. The format is detected from the
first bytes. Every item is decoded with the collector's decoder (spec-exact OTLP/JSON, id
validation), so a dump is accepted exactly as the same data sent to ``tracedag collect`` would be,
and its valid spans take the collector's road into Parquet: spool segments converted by the
spool converter (``direct``). A bad item is reported with its line (or record number) and
skipped; the rest is read.
"""

from __future__ import annotations

import gzip
import io
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Literal

from tracedag.collector.decode import DecodeError, decode_request
from tracedag.pipeline.ingest.direct import BATCH_SPANS, DirectIngest
from tracedag.pipeline.ingest.writer import ConvertStats

logger = logging.getLogger(__name__)

Format = Literal["jsonl", "json", "protobuf"]

_GZIP_MAGIC = b"\x1f\x8b"
_MAX_RECORD = 256 * 1024 * 1024


@dataclass
class DumpItem:
    """One request read from a dump: its valid spans as protobuf bytes, or why it was skipped."""

    where: str  # "line 12" or "record 3"
    offset: int  # bytes of the (uncompressed) file consumed after this item
    payload: bytes = b""
    accepted: int = 0
    rejected: int = 0
    reasons: tuple[tuple[str, int], ...] = ()
    error: str | None = None


@dataclass
class DumpSummary:
    """Counters of one file, filled while it is read."""

    format: str = ""
    items: int = 0
    bad_items: int = 0
    spans_read: int = 0
    rejected: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def count(self, item: DumpItem) -> None:
        """Add one item's figures."""
        self.items += 1
        self.spans_read += item.accepted + item.rejected
        self.rejected += item.rejected
        for reason, n in item.reasons:
            self.reasons[reason] = self.reasons.get(reason, 0) + n
        if item.error is not None:
            self.bad_items += 1
            self.errors.append(f"{item.where}: {item.error}")


def open_dump(path: Path) -> BinaryIO:
    """Open a dump for reading, decompressing gzip transparently."""
    with open(path, "rb") as probe:
        compressed = probe.read(2) == _GZIP_MAGIC
    if compressed:
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")


def detect_format(first_line: bytes, more: bool) -> Format:
    """Guess the format from the first line of the (uncompressed) file and whether more lines follow."""
    text = first_line.lstrip()
    if not text.startswith(b"{"):
        return "protobuf"
    try:
        json.loads(text)
    except ValueError:
        return "json"  # the first line is not a whole document: a pretty-printed one
    return "jsonl" if more else "json"


def read_dump(path: Path) -> tuple[Format, Iterator[DumpItem]]:
    """Return the detected format of ``path`` and an iterator over its items."""
    with open_dump(path) as fh:
        first = fh.read(64)
        if first.lstrip().startswith(b"{"):
            first += fh.readline(_MAX_RECORD)
        more = any(line.strip() for line in _lines_after(fh))
    fmt = detect_format(first, more)
    readers = {"jsonl": _json_lines, "json": _json_document, "protobuf": _length_prefixed}
    return fmt, readers[fmt](path)


def _lines_after(fh: BinaryIO) -> Iterator[bytes]:
    """The next few lines (enough to tell JSON lines from one document)."""
    for _ in range(3):
        line = fh.readline(1 << 20)
        if not line:
            return
        yield line


def _decode(body: bytes, encoding: Literal["json", "protobuf"], where: str, offset: int) -> DumpItem:
    try:
        d = decode_request(body, encoding)
    except DecodeError as exc:
        return DumpItem(where, offset, rejected=exc.rejected, error=exc.message[:300],
                        reasons=((exc.message[:120], exc.rejected),) if exc.rejected else ())
    return DumpItem(where, offset, d.payload, d.accepted, d.rejected, d.reasons)


def _json_lines(path: Path) -> Iterator[DumpItem]:
    offset = 0
    with open_dump(path) as fh:
        for number, line in enumerate(fh, start=1):
            offset += len(line)
            if line.strip():
                yield _decode(line, "json", f"line {number}", offset)


def _json_document(path: Path) -> Iterator[DumpItem]:
    with open_dump(path) as fh:
        body = fh.read()
    yield _decode(body, "json", "document", len(body))


def _length_prefixed(path: Path) -> Iterator[DumpItem]:
    with open_dump(path) as fh:
        yield from _records(fh)


def _records(fh: BinaryIO | io.BufferedReader) -> Iterator[DumpItem]:
    offset, number = 0, 0
    while True:
        header = fh.read(4)
        if not header:
            return
        number += 1
        size = int.from_bytes(header, "big")
        if len(header) < 4 or size > _MAX_RECORD:
            yield DumpItem(f"record {number}", offset, error="not a length-prefixed protobuf record; rest skipped")
            return
        body = fh.read(size)
        offset += 4 + len(body)
        if len(body) < size:
            yield DumpItem(f"record {number}", offset, error=f"truncated: {len(body)} of {size} bytes")
            return
        yield _decode(body, "protobuf", f"record {number}", offset)


@dataclass
class FileResult:
    """What ``ingest_dump`` did with one file."""

    path: Path
    summary: DumpSummary
    stats: ConvertStats


def ingest_dump(
    data: Path, path: Path, on_progress: Callable[[int], None] | None = None,
    batch_spans: int = BATCH_SPANS, received_unix_nano: int | None = None,
) -> FileResult:
    """Read one dump; its valid spans go through file segments of the spool into Parquet (see ``direct``)."""
    fmt, items = read_dump(path)
    summary = DumpSummary(format=fmt)
    direct = DirectIngest(data, batch_spans, received_unix_nano)
    for item in items:
        summary.count(item)
        if item.error is not None:
            logger.warning("%s, %s: %s (skipped)", path, item.where, item.error)
        if item.payload:
            direct.add(item.payload, item.accepted)
        if on_progress is not None:
            on_progress(item.offset)
    return FileResult(path, summary, direct.close())
