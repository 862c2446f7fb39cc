"""Small hand-built stores: DAG nodes, dependency edges, scores, traces and spans as Parquet."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from tracedag.pipeline.store.parquet import write_parquet_atomic
from tracedag.schemas.layout import table_dir
from tracedag.schemas.spans import SPANS_V1
from tracedag.schemas.tables import DAG_EDGES_V1, DAG_NODES_V1, STEP_SCORES_V1, TRACES_V1

T0 = 1_700_000_000_000_000_000  # ns; every fixture trace starts at T0 + its offset
MS = 1_000_000
BUILD = "b1"


@dataclass
class Step:
    span_id: str
    parent: str | None
    name: str
    start_ms: int
    end_ms: int
    step_type: str = "tool"
    iteration: int = 1
    step_key: str | None = None
    is_retry: bool = False
    model: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    input_text: str | None = None
    error_type: str | None = None
    status_message: str | None = None


@dataclass
class Score:
    span_id: str
    score: float
    metric: str = "correctness"
    source: str = "rule"
    taxonomy_l1: str | None = None
    taxonomy_l2: str | None = None
    taxonomy_l3: str | None = None


@dataclass
class Trace:
    trace_id: str
    offset_ms: int
    steps: list[Step]
    sequence: list[tuple[str, str]] = field(default_factory=list)  # earlier sibling -> later sibling
    scores: list[Score] = field(default_factory=list)
    method: str = "inferred"
    conversation_id: str | None = None
    flat: bool = False  # flat fallback: no edges, no nested set


def _nested_set(steps: list[Step]) -> dict[str, tuple[int, int, int]]:
    children: dict[str | None, list[Step]] = {}
    for s in steps:
        children.setdefault(s.parent, []).append(s)
    out: dict[str, tuple[int, int, int]] = {}
    counter = 0

    def visit(s: Step, depth: int) -> None:
        nonlocal counter
        counter += 1
        left = counter
        for c in sorted(children.get(s.span_id, []), key=lambda c: (c.start_ms, c.span_id)):
            visit(c, depth + 1)
        counter += 1
        out[s.span_id] = (left, counter, depth)

    for root in children.get(None, []):
        visit(root, 0)
    return out


def _node_rows(t: Trace) -> list[dict[str, object]]:
    ns = _nested_set(t.steps)
    base = T0 + t.offset_ms * MS
    order = sorted(t.steps, key=lambda s: (s.start_ms, s.span_id))
    rows = []
    for i, s in enumerate(order):
        left, right, depth = ns[s.span_id]
        rows.append({
            "trace_id": t.trace_id, "span_id": s.span_id, "build_id": BUILD, "parent_span_id": s.parent,
            "step_type": s.step_type, "step_name": s.name, "step_key": s.step_key or f"{s.step_type}:{s.name}",
            "iteration": s.iteration, "is_retry": s.is_retry, "branch_id": 0, "depth": depth,
            "topo_index": i, "nested_left": None if t.flat else left, "nested_right": None if t.flat else right,
            "is_orphan": False, "clock_skew": False,
            "start_time_unix_nano": base + s.start_ms * MS, "end_time_unix_nano": base + s.end_ms * MS,
            "duration_ns": (s.end_ms - s.start_ms) * MS, "status_code": 0, "spec_node": None,
        })
    return rows


def _edge_rows(t: Trace) -> list[dict[str, object]]:
    if t.flat:
        return []
    rows = []
    for s in t.steps:
        if s.parent is not None:  # call edge parent -> child; dependency child -> parent
            rows.append({"trace_id": t.trace_id, "build_id": BUILD, "src_span_id": s.parent,
                         "dst_span_id": s.span_id, "edge_kind": "parent",
                         "upstream_span_id": s.span_id, "downstream_span_id": s.parent})
    for a, b in t.sequence:
        rows.append({"trace_id": t.trace_id, "build_id": BUILD, "src_span_id": a, "dst_span_id": b,
                     "edge_kind": "sequence", "upstream_span_id": a, "downstream_span_id": b})
    return rows


def _trace_row(t: Trace) -> dict[str, object]:
    base = T0 + t.offset_ms * MS
    start = min(s.start_ms for s in t.steps)
    end = max(s.end_ms for s in t.steps)
    root = next(s.span_id for s in t.steps if s.parent is None)
    return {
        "trace_id": t.trace_id, "build_id": BUILD, "built_unix_nano": base + end * MS,
        "last_received_unix_nano": base + end * MS, "root_span_id": root, "service_name": "agent-svc",
        "service_version": "1.0", "conversation_id": t.conversation_id, "run_id": None, "scenario_id": None,
        "replay_index": None, "variant_id": None, "start_time_unix_nano": base + start * MS,
        "end_time_unix_nano": base + end * MS, "duration_ns": (end - start) * MS,
        "span_count": len(t.steps), "error_count": 0, "root_count": 1, "orphan_count": 0,
        "clock_skew_count": 0, "connected": not t.flat, "method": t.method,
        "fallback_reason": "cycle in explicit edges" if t.flat else None, "deviant": False,
        "deviation_reason": None,
    }


def _score_rows(t: Trace) -> list[dict[str, object]]:
    return [{
        "trace_id": t.trace_id, "span_id": s.span_id, "build_id": None if s.source == "human" else BUILD,
        "metric": s.metric, "score": s.score, "label": None, "source": s.source, "rule_name": None,
        "judge_model": None, "rubric_version": None, "explanation": f"{s.metric}={s.score}",
        "taxonomy_l1": s.taxonomy_l1, "taxonomy_l2": s.taxonomy_l2, "taxonomy_l3": s.taxonomy_l3,
        "scored_unix_nano": T0,
    } for s in t.scores]


def _span_rows(t: Trace) -> list[dict[str, object]]:
    base = T0 + t.offset_ms * MS
    return [{
        "trace_id": t.trace_id, "span_id": s.span_id, "parent_span_id": s.parent, "name": s.name,
        "service_name": "agent-svc", "kind": 1, "status_code": 0,
        "start_time_unix_nano": base + s.start_ms * MS, "end_time_unix_nano": base + s.end_ms * MS,
        "duration_ns": (s.end_ms - s.start_ms) * MS, "received_unix_nano": base + s.end_ms * MS,
        "step_type": s.step_type, "step_name": s.name, "conversation_id": t.conversation_id,
        "model": s.model, "input_tokens": s.input_tokens, "output_tokens": s.output_tokens,
        "input_text": s.input_text, "error_type": s.error_type, "status_message": s.status_message,
    } for s in t.steps]


def _table(rows: list[dict[str, object]], schema: pa.Schema) -> pa.Table:
    cols = {f.name: [r.get(f.name) for r in rows] for f in schema}
    return pa.Table.from_pydict(cols, schema=schema)


def write_store(data: Path, traces: list[Trace]) -> Path:
    """Write the tables of ``traces`` into the store at ``data`` and return ``data``."""
    parts = {
        "traces": ([_trace_row(t) for t in traces], TRACES_V1),
        "dag_nodes": ([r for t in traces for r in _node_rows(t)], DAG_NODES_V1),
        "dag_edges": ([r for t in traces for r in _edge_rows(t)], DAG_EDGES_V1),
        "step_scores": ([r for t in traces for r in _score_rows(t)], STEP_SCORES_V1),
        "spans": ([r for t in traces for r in _span_rows(t)], SPANS_V1),
    }
    for table, (rows, schema) in parts.items():
        write_parquet_atomic(_table(rows, schema), table_dir(data, table))
    return data
