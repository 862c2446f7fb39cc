"""Arrow tables to HTTP bodies, streamed by record batch: json, csv, arrow (IPC stream), parquet.

JSON is an array of objects (times ISO 8601, ``NaN`` as null); each chunk of rows is encoded and
sent before the next one is built, so a large result never exists twice as text.
"""

from __future__ import annotations

import datetime as dt
import decimal
import io
import json
import math
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

FORMATS = {
    "json": "application/json",
    "csv": "text/csv; charset=utf-8",
    "arrow": "application/vnd.apache.arrow.stream",
    "parquet": "application/vnd.apache.parquet",
}
CHUNK_ROWS = 4096


def default(value: Any) -> Any:
    """JSON for the values Arrow hands back that ``json`` does not know."""
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def dumps(obj: Any) -> str:
    """Strict JSON (no NaN) of query results and trace documents."""
    return json.dumps(_clean(obj), default=default, allow_nan=False)


def flat_nested(table: pa.Table) -> pa.Table:
    """``table`` with each list, struct or map column replaced by the JSON text of its values."""
    for i, field in enumerate(table.schema):
        if pa.types.is_nested(field.type):
            texts = [None if v is None else dumps(v) for v in table.column(i).to_pylist()]
            table = table.set_column(i, field.name, pa.array(texts, pa.string()))
    return table


def stream(table: pa.Table, fmt: str) -> Iterator[bytes]:
    """Yield ``table`` encoded as ``fmt`` in chunks."""
    batches = table.to_batches(max_chunksize=CHUNK_ROWS)
    if fmt == "json":
        yield from _json(batches)
    elif fmt == "csv":  # CSV has no lists or structs: those columns are sent as their JSON text
        flat = flat_nested(table)
        yield from _via(flat.schema, flat.to_batches(max_chunksize=CHUNK_ROWS),
                        lambda sink: pacsv.CSVWriter(sink, flat.schema))
    elif fmt == "arrow":
        yield from _via(table.schema, batches, lambda sink: pa.ipc.new_stream(sink, table.schema))
    elif fmt == "parquet":  # the footer holds absolute offsets: written whole, then sent in chunks
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        body = sink.getvalue().to_pybytes()
        for start in range(0, len(body), 1 << 20):
            yield body[start:start + (1 << 20)]
    else:
        raise ValueError(fmt)


def _json(batches: list[pa.RecordBatch]) -> Iterator[bytes]:
    yield b"["
    first = True
    for batch in batches:
        rows = batch.to_pylist()
        if not rows:
            continue
        text = ",".join(dumps(r) for r in rows)
        yield (text if first else "," + text).encode()
        first = False
    yield b"]"


def _via(schema: pa.Schema, batches: list[pa.RecordBatch], open_writer: Any) -> Iterator[bytes]:
    sink = io.BytesIO()
    writer = open_writer(sink)
    for batch in batches:
        writer.write_batch(batch)
        if sink.tell():
            yield sink.getvalue()
            sink.seek(0)
            sink.truncate()
    writer.close()
    rest = sink.getvalue()
    if rest:
        yield rest
