"""Hand-built ``spans`` tables for the DAG tests: one dict per span, times in milliseconds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from tracedag.pipeline.store.parquet import write_parquet_atomic
from tracedag.pipeline.store.shared_macros import calls_shared_macros
from tracedag.pipeline.store.views import connect
from tracedag.schemas.layout import table_dir
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


def run(rows: list[dict[str, Any]], **kw: Any) -> Built:
    """Reconstruct ``rows`` and index the result for assertions."""
    from tracedag.pipeline.dag.reconstruct import reconstruct

    traces, nodes, edges = reconstruct(table(rows), "build-test", 42, **kw)
    return Built(traces.to_pylist(), {n["span_id"]: n for n in nodes.to_pylist()}, edges.to_pylist())


class Built:
    """Result of one reconstruction, indexed."""

    def __init__(self, traces: list[dict[str, Any]], nodes: dict[str, dict[str, Any]], edges: list[dict[str, Any]]):
        self.traces = traces
        self.trace = traces[0] if traces else {}
        self.nodes = nodes
        self.edges = edges

    def kind(self, kind: str) -> set[tuple[str, str]]:
        """(src, dst) pairs of the edges of one kind."""
        return {(e["src_span_id"], e["dst_span_id"]) for e in self.edges if e["edge_kind"] == kind}

    def col(self, name: str) -> dict[str, Any]:
        """span_id -> value of one dag_nodes column."""
        return {s: n[name] for s, n in self.nodes.items()}

    def topo_order(self) -> list[str]:
        """span ids by topological index."""
        return sorted(self.nodes, key=lambda s: (self.nodes[s]["trace_id"], self.nodes[s]["topo_index"]))


def write_spans(data: Path, rows: list[dict[str, Any]]) -> None:
    """Store ``rows`` as one spans Parquet file of the data directory ``data``."""
    write_parquet_atomic(table(rows), table_dir(data, "spans"))


def q(data: Path, sql: str) -> list[tuple[Any, ...]]:
    """Rows of ``sql`` over the views of ``data`` (a fresh connection, closed after). The shared query macros are
    bound only when ``sql`` calls one: binding them is most of a connection's CPU (66 -> 28 ms on a small store),
    and the tests ask hundreds of these."""
    con = connect(data, shared_macros=calls_shared_macros(sql))
    try:
        return con.sql(sql).fetchall()
    finally:
        con.close()
