"""Hand-built ``spans`` tables for the DAG tests: one dict per span, times in milliseconds."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from tracedag.schemas.spans import SPANS_V1

MS = 1_000_000
T0 = 1_700_000_000_000 * MS


def span(
    span_id: str,
    parent: str | None,
    start_ms: float,
    end_ms: float,
    name: str | None = None,
    trace_id: str = "t1",
    status: int = 0,
    received: int = 1,
    **extra: Any,
) -> dict[str, Any]:
    """One span row: ids are short readable strings, times are ms after ``T0``."""
    row: dict[str, Any] = {
        "trace_id": trace_id,
        "span_id": span_id,
        "parent_span_id": parent,
        "name": name or span_id,
        "service_name": "svc",
        "status_code": status,
        "start_time_unix_nano": T0 + int(start_ms * MS),
        "end_time_unix_nano": T0 + int(end_ms * MS),
        "duration_ns": int((end_ms - start_ms) * MS),
        "received_unix_nano": received,
        "batch_id": f"b{received}",
        "step_name": name or span_id,
        "step_type": extra.pop("step_type", "chain"),
        "links": extra.pop("links", []),
    }
    row.update(extra)
    return row


def table(rows: list[dict[str, Any]]) -> pa.Table:
    """A ``SPANS_V1`` table of the given rows (missing columns null)."""
    cols = {f.name: [r.get(f.name) for r in rows] for f in SPANS_V1}
    return pa.Table.from_pydict(cols, schema=SPANS_V1)
