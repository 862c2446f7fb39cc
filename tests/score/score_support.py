"""Small hand-built stores for the scoring tests: spans, traces, dag_nodes, dag_edges, evaluations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tracedag.pipeline.store.parquet import write_parquet_atomic
from tracedag.schemas.layout import table_dir
from tracedag.schemas.spans import SPANS_V1
from tracedag.schemas.tables import DAG_EDGES_V1, DAG_NODES_V1, EVALUATIONS_V1, TRACES_V1


def _rows(schema: pa.Schema, rows: list[dict[str, Any]]) -> pa.Table:
    full = [{f.name: r.get(f.name) for f in schema} for r in rows]
    for r in full:
        for f in schema:
            if pa.types.is_map(f.type) and isinstance(r[f.name], dict):
                r[f.name] = list(r[f.name].items())
            if f.name == "events" and r[f.name]:
                r[f.name] = [{**e, "attributes": list((e.get("attributes") or {}).items())} for e in r[f.name]]
    return pa.Table.from_pylist(full, schema=schema)


def span(trace_id: str, span_id: str, parent: str | None = None, **kw: Any) -> dict[str, Any]:
    """A spans row with sensible defaults; keyword arguments set any SPANS_V1 column."""
    row = {"trace_id": trace_id, "span_id": span_id, "parent_span_id": parent, "name": kw.get("step_name", span_id),
           "status_code": 0, "start_time_unix_nano": 1_000, "end_time_unix_nano": 2_000, "duration_ns": 1_000,
           "received_unix_nano": 1, "attributes": {}, "events": []}
    row.update(kw)
    return row


def agent_turn(trace: str, conversation: str, start: int, failing: str) -> list[dict[str, Any]]:
    """An agent turn of ``conversation``: a root, a tool ``failing`` that errors (a failure the rules score 1) and
    the answer, received at ``start``."""
    base = {"conversation_id": conversation, "received_unix_nano": start}
    root = span(trace, f"{trace}-r", None, step_type="agent", step_name="agent", start_time_unix_nano=start,
                end_time_unix_nano=start + 100, duration_ns=100, **base)
    tool = span(trace, f"{trace}-t", f"{trace}-r", step_type="tool", step_name=failing, status_code=2,
                error_type="ToolError", status_message="tool broke", start_time_unix_nano=start + 10,
                end_time_unix_nano=start + 20, duration_ns=10, **base)
    llm = span(trace, f"{trace}-l", f"{trace}-r", step_type="llm", step_name="answer", start_time_unix_nano=start + 30,
               end_time_unix_nano=start + 40, duration_ns=10, **base)
    return [root, tool, llm]


class StoreBuilder:
    """Writes hand-built traces into a data directory the way ingest and build would."""

    def __init__(self, data: Path) -> None:
        self.data = data

    def spans(self, rows: list[dict[str, Any]]) -> None:
        write_parquet_atomic(_rows(SPANS_V1, rows), table_dir(self.data, "spans"))

    def evaluations(self, rows: list[dict[str, Any]]) -> None:
        write_parquet_atomic(_rows(EVALUATIONS_V1, rows), table_dir(self.data, "evaluations"))

    def build(self, spans: list[dict[str, Any]], build_id: str = "b1", built: int = 10,
              edges: list[tuple[str, str]] = ()) -> None:
        """Write traces/dag_nodes/dag_edges for ``spans`` (topo order = list order); edges = (upstream, downstream)."""
        by_trace: dict[str, list[dict[str, Any]]] = {}
        for s in spans:
            by_trace.setdefault(s["trace_id"], []).append(s)
        traces, nodes = [], []
        for tid, ss in by_trace.items():
            traces.append({"trace_id": tid, "build_id": build_id, "built_unix_nano": built, "span_count": len(ss),
                           "root_span_id": ss[0]["span_id"], "connected": True, "method": "inferred"})
            for i, s in enumerate(ss):
                nodes.append({"trace_id": tid, "span_id": s["span_id"], "build_id": build_id,
                              "parent_span_id": s.get("parent_span_id"), "step_type": s.get("step_type"),
                              "step_name": s.get("step_name"), "step_key": s.get("step_name"),
                              "iteration": s.get("iteration", 1), "topo_index": i, "depth": 0,
                              "status_code": s.get("status_code")})
        tid0 = spans[0]["trace_id"]
        edge_rows = [{"trace_id": tid0, "build_id": build_id, "src_span_id": u, "dst_span_id": d,
                      "edge_kind": "sequence", "upstream_span_id": u, "downstream_span_id": d} for u, d in edges]
        write_parquet_atomic(_rows(TRACES_V1, traces), table_dir(self.data, "traces"))
        write_parquet_atomic(_rows(DAG_NODES_V1, nodes), table_dir(self.data, "dag_nodes"))
        if edge_rows:
            write_parquet_atomic(_rows(DAG_EDGES_V1, edge_rows), table_dir(self.data, "dag_edges"))


@pytest.fixture
def builder(tmp_path: Path) -> StoreBuilder:
    return StoreBuilder(tmp_path / "data")
