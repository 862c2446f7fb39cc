"""The body of a ``POST /api/sql`` answer, encoded in the SQL worker and bounded in rows and bytes.

``write_answer`` reads the query's Arrow batches one at a time, encodes each (JSON, CSV or the
Arrow stream; Parquet is the bounded Arrow stream written again as one file at the end) and
writes it out at once, counting bytes. Past ``max_bytes`` it raises ``TooLarge``, or, when the
client asked for a truncated answer, ends with the last rows that fit and marks it truncated. So
neither the worker nor the server ever holds more than about ``max_bytes`` of answer.

JSON: ``{"columns": [...], "rows": [{...}, ...], "truncated": false}``.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from tracedag.pipeline.serve import encode
from tracedag.schemas.errors import QueryFailed

BATCH_ROWS = 512
"""Rows per batch read from DuckDB: small, so one batch of wide rows stays small too."""
PIECE_BYTES = 1 << 20
"""Arrow bytes encoded at a time (a slice of a batch)."""


class Writable(Protocol):
    """Where an answer's bytes go: a binary file, or the worker's holding wrapper around one."""

    def write(self, data: bytes, /) -> int: ...


class TooLarge(QueryFailed):  # type: ignore[misc,unused-ignore]
    """The answer would be larger than its byte limit (and no truncated answer was asked for)."""


@dataclass(frozen=True)
class Bounds:
    """The bounds of one answer: rows, bytes, and whether to cut at the byte bound instead of refusing."""

    max_rows: int
    max_bytes: int
    truncate: bool = False


@dataclass(frozen=True)
class Written:
    """What ``write_answer`` wrote."""

    rows: int
    bytes: int
    truncated: bool


class _Encoder(Protocol):
    tail_max: int

    def head(self) -> bytes: ...
    def encode(self, batch: pa.RecordBatch, first: bool) -> bytes: ...
    def tail(self, truncated: bool) -> bytes: ...


class _Json:
    tail_max = len(b'],"truncated":false}')

    def __init__(self, schema: pa.Schema) -> None:
        self.names = schema.names

    def head(self) -> bytes:
        return b'{"columns":' + json.dumps(self.names).encode() + b',"rows":['

    def encode(self, batch: pa.RecordBatch, first: bool) -> bytes:
        text = ",".join(encode.dumps(row) for row in encode.rows(batch))
        return (text if first or not text else "," + text).encode()

    def tail(self, truncated: bool) -> bytes:
        return b'],"truncated":' + (b"true" if truncated else b"false") + b"}"


class _Csv:
    tail_max = 0

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = encode.flat_nested(schema.empty_table()).schema

    def head(self) -> bytes:
        sink = io.BytesIO()
        pacsv.write_csv(self.schema.empty_table(), sink)
        return sink.getvalue()

    def encode(self, batch: pa.RecordBatch, first: bool) -> bytes:
        sink = io.BytesIO()
        table = encode.flat_nested(pa.Table.from_batches([batch]))
        pacsv.write_csv(table, sink, pacsv.WriteOptions(include_header=False))
        return sink.getvalue()

    def tail(self, truncated: bool) -> bytes:
        return b""


class _Arrow:
    tail_max = 8  # the end-of-stream marker

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema

    def _stream(self, batch: pa.RecordBatch | None) -> bytes:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, self.schema) as writer:
            if batch is not None:
                writer.write_batch(batch)
        return bytes(sink.getvalue().to_pybytes())

    def head(self) -> bytes:
        return self._stream(None)[:-self.tail_max]

    def encode(self, batch: pa.RecordBatch, first: bool) -> bytes:
        empty = len(self._stream(None))
        return self._stream(batch)[empty - self.tail_max:-self.tail_max]

    def tail(self, truncated: bool) -> bytes:
        return self._stream(None)[-self.tail_max:]


_ENCODERS: dict[str, type[_Json] | type[_Csv] | type[_Arrow]] = {"json": _Json, "csv": _Csv, "arrow": _Arrow}


class _Sink:
    def __init__(self, out: Writable) -> None:
        self.out = out
        self.count = 0

    def write(self, data: bytes) -> None:
        self.out.write(data)
        self.count += len(data)


def _largest_prefix(enc: _Encoder, batch: pa.RecordBatch, first: bool, room: int) -> tuple[int, bytes]:
    """The most leading rows of ``batch`` whose encoding fits in ``room`` bytes, and that encoding."""
    lo, hi, best = 0, batch.num_rows - 1, b""  # the whole batch does not fit; 0 rows always do
    while lo < hi:
        mid = (lo + hi + 1) // 2
        piece = enc.encode(batch.slice(0, mid), first)
        if len(piece) <= room:
            lo, best = mid, piece
        else:
            hi = mid - 1
    return lo, best


def _too_large(bounds: Bounds) -> TooLarge:
    return TooLarge("sql", f"the answer is larger than {bounds.max_bytes} bytes (--sql-max-bytes); add a LIMIT, "
                           "select fewer or shorter columns, or ask for the rows that fit with ?truncate=1")


def _pieces(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The batches cut into slices of about ``PIECE_BYTES`` of Arrow data, so a row too many is found
    after encoding at most one slice more than fits (a batch of wide rows is tens of MB)."""
    for batch in batches:
        per_row = max(1, batch.nbytes // max(1, batch.num_rows))
        step = max(1, PIECE_BYTES // per_row)
        for start in range(0, batch.num_rows, step):
            yield batch.slice(start, step)


def _stream_answer(batches: Iterable[pa.RecordBatch], enc: _Encoder, bounds: Bounds, sink: _Sink) -> Written:
    sink.write(enc.head())
    rows, truncated = 0, False
    for batch in _pieces(batches):
        if batch.num_rows == 0:
            continue
        if rows == bounds.max_rows:
            truncated = True
            break
        cut = batch.num_rows > bounds.max_rows - rows
        batch = batch.slice(0, bounds.max_rows - rows) if cut else batch
        room = bounds.max_bytes - sink.count - enc.tail_max
        piece = enc.encode(batch, rows == 0)
        if len(piece) > room:
            if not bounds.truncate:
                raise _too_large(bounds)
            fit, piece = _largest_prefix(enc, batch, rows == 0, room)
            batch, cut = batch.slice(0, fit), True
        sink.write(piece)
        rows += batch.num_rows
        if cut:
            truncated = True
            break
    sink.write(enc.tail(truncated))
    return Written(rows, sink.count, truncated)


def write_answer(reader: pa.RecordBatchReader, fmt: str, bounds: Bounds, out: Writable) -> Written:
    """Encode the batches of ``reader`` as ``fmt`` into ``out`` within ``bounds``; raise ``TooLarge``."""
    if fmt == "parquet":
        return _parquet(reader, bounds, out)
    enc: _Encoder = _ENCODERS[fmt](reader.schema)
    return _stream_answer(reader, enc, bounds, _Sink(out))


def _parquet(reader: pa.RecordBatchReader, bounds: Bounds, out: Writable) -> Written:
    """Parquet's footer holds absolute offsets: the rows are bounded as an Arrow stream, then written whole."""
    buffer = io.BytesIO()
    written = _stream_answer(reader, _Arrow(reader.schema), bounds, _Sink(buffer))
    table = pa.ipc.open_stream(buffer.getvalue()).read_all()
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    body = sink.getvalue()
    if body.size > bounds.max_bytes:
        raise _too_large(bounds)
    out.write(body.to_pybytes())
    return Written(written.rows, body.size, written.truncated)
