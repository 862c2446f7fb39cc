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


def rows(batch: pa.RecordBatch | pa.Table) -> list[dict[str, Any]]:
    """``batch.to_pylist()``, with dates and times Python cannot hold (year 10000, infinity) as text."""
    try:
        listed: list[dict[str, Any]] = batch.to_pylist()
        return listed
    except (OverflowError, ValueError):
        columns = [_column_values(batch.column(i)) for i in range(batch.num_columns)]
        return [dict(zip(batch.schema.names, values, strict=True)) for values in zip(*columns, strict=True)]


def _column_values(column: pa.Array | pa.ChunkedArray) -> list[Any]:
    try:
        values: list[Any] = column.to_pylist()
        return values
    except (OverflowError, ValueError):
        if not pa.types.is_temporal(column.type):
            raise
        return _temporal_text(column)


_INFINITY = {2**31 - 1: "infinity", -(2**31 - 1): "-infinity", 2**63 - 1: "infinity", -(2**63 - 1): "-infinity"}
_PER_SECOND = {"s": 1, "ms": 1000, "us": 1_000_000, "ns": 1_000_000_000}


def _temporal_text(column: pa.Array | pa.ChunkedArray) -> list[str | None]:
    """ISO 8601 text of a date or timestamp column whose values lie beyond Python's (DuckDB's infinities too)."""
    kind = column.type
    raw = column.cast(pa.int64() if pa.types.is_timestamp(kind) or pa.types.is_date64(kind) else pa.int32())
    out: list[str | None] = []
    for v in raw.to_pylist():
        if v is None or v in _INFINITY:
            out.append(None if v is None else _INFINITY[v])
        elif pa.types.is_date32(kind):
            out.append(_civil(v))
        else:
            per = 1000 if pa.types.is_date64(kind) else _PER_SECOND[kind.unit]
            out.append(_instant(v, per, pa.types.is_timestamp(kind) and kind.tz is not None))
    return out


def _civil(days: int) -> str:
    """Proleptic Gregorian date of ``days`` after 1970-01-01 (H. Hinnant's days-to-civil), any year."""
    z = days + 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day, month = doy - (153 * mp + 2) // 5 + 1, mp + 3 if mp < 10 else mp - 9
    year = yoe + era * 400 + (month <= 2)
    return f"{year:04d}-{month:02d}-{day:02d}" if year >= 0 else f"-{-year:04d}-{month:02d}-{day:02d}"


def _instant(value: int, per_second: int, utc: bool) -> str:
    seconds, fraction = divmod(value, per_second)
    days, second = divmod(seconds, 86400)
    text = f"{_civil(days)}T{second // 3600:02d}:{second // 60 % 60:02d}:{second % 60:02d}"
    if fraction:
        text += "." + f"{fraction * 1_000_000 // per_second:06d}"
    return text + ("+00:00" if utc else "")


def _json(batches: list[pa.RecordBatch]) -> Iterator[bytes]:
    yield b"["
    first = True
    for batch in batches:
        items = rows(batch)
        if not items:
            continue
        text = ",".join(dumps(r) for r in items)
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
