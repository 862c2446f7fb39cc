"""Turn the per-row arrays of a reconstruction into the ``traces``, ``dag_nodes``, ``dag_edges`` tables."""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracedag.pipeline.dag import duck
from tracedag.pipeline.dag.graph import Graph
from tracedag.pipeline.dag.roles import step_roles
from tracedag.pipeline.dag.siblings import arrow
from tracedag.pipeline.dag.spec import WorkflowSpec
from tracedag.pipeline.dag.traces import traces_table
from tracedag.pipeline.dag.tree import IntArray
from tracedag.schemas.tables import DAG_EDGES_V1, DAG_NODES_V1, TRACES_V1

logger = logging.getLogger(__name__)

EDGE_KINDS = pa.array(["parent", "orphan_attach", "sequence", "explicit", "tool_call", "data"])
"""Edge kinds by code; ``data`` edges (value provenance) are written at score time (``score.provenance``)."""


def _ids(prep: pa.Table, rows: IntArray) -> pa.Array:
    return prep.column("span_id").take(pa.array(rows))


def nodes_table(prep: pa.Table, g: Graph, build_id: str, spec: WorkflowSpec | None) -> pa.Table:
    """The ``dag_nodes`` rows of one reconstruction."""
    n = prep.num_rows
    has_parent = g.parent >= 0
    parent_ids = pc.if_else(pa.array(has_parent), _ids(prep, np.maximum(g.parent, 0)), None)
    step_type = prep.column("step_type")
    keys = pa.array(g.key_texts, pa.string()).take(pa.array(g.key))
    spec_nodes = _spec_nodes(spec, step_type, prep.column("step_name"))
    cols = {
        "trace_id": prep.column("trace_id"),
        "span_id": prep.column("span_id"),
        "build_id": pa.repeat(pa.scalar(build_id), n),
        "parent_span_id": parent_ids,
        "step_type": step_type,
        "step_name": prep.column("step_name"),
        "step_key": keys,
        "iteration": g.iteration,
        "is_retry": g.retry,
        "branch_id": g.branch,
        "depth": g.depth,
        "topo_index": g.topo,
        "nested_left": g.left,
        "nested_right": g.right,
        "is_orphan": g.orphan,
        "clock_skew": g.skew,
        "start_time_unix_nano": g.eff_s,
        "end_time_unix_nano": g.eff_e,
        "duration_ns": g.eff_e - g.eff_s,
        "status_code": prep.column("status_code"),
        "spec_node": spec_nodes,
        "step_role": step_roles(prep, g, spec_nodes, spec),
    }
    arrays = [pa.array(cols[f.name]).cast(f.type) if not isinstance(cols[f.name], pa.ChunkedArray)
              else cols[f.name].cast(f.type) for f in DAG_NODES_V1]
    return pa.Table.from_arrays(arrays, schema=DAG_NODES_V1)


def _spec_nodes(spec: WorkflowSpec | None, step_type: pa.ChunkedArray, step_name: pa.ChunkedArray) -> pa.Array:
    if spec is None:
        return pa.nulls(len(step_name), pa.string())
    pairs = pa.table({"t": step_type, "n": step_name})
    uniq = pairs.group_by(["t", "n"]).aggregate([]).to_pylist()
    lookup = {(r["t"], r["n"]): spec.match(r["t"], r["n"]) for r in uniq}
    return pa.array([lookup[(t, nm)] for t, nm in zip(step_type.to_pylist(), step_name.to_pylist(), strict=True)],
                    pa.string())


def edges_table(prep: pa.Table, g: Graph, build_id: str) -> pa.Table:
    """The ``dag_edges`` rows: call tree (parent / orphan_attach), sequence, explicit and tool_call edges."""
    child = np.flatnonzero(g.parent >= 0)
    flat_rows = np.isin(g.trace, np.fromiter(g.flat, dtype=np.int64, count=len(g.flat)))
    seq = ~flat_rows[g.seq_src] if g.seq_src.size else np.zeros(0, dtype=np.bool_)
    x_src, x_dst = np.asarray(g.x_src, dtype=np.int64), np.asarray(g.x_dst, dtype=np.int64)
    tc = ~flat_rows[g.tc_dst] if g.tc_dst.size else np.zeros(0, dtype=np.bool_)
    src = np.concatenate([g.parent[child], g.seq_src[seq], x_src, g.tc_src[tc]])
    dst = np.concatenate([child, g.seq_dst[seq], x_dst, g.tc_dst[tc]])
    kinds = np.concatenate([
        np.where(g.attached[child], 1, 0),
        np.full(int(seq.sum()), 2),
        np.full(x_src.size, 3),
        np.full(int(tc.sum()), 4),
    ]).astype(np.int8)
    tree_edge = np.arange(src.size) < child.size
    # in trace order (stable), as the build writes them (``build.by_trace``): the trace numbers follow the trace ids
    order = np.argsort(g.trace[dst], kind="stable")
    src, dst, kinds, tree_edge = src[order], dst[order], kinds[order], tree_edge[order]
    n = src.size
    # tree edges: a child (dst) influences its parent (src); the others: src influences dst
    return pa.Table.from_arrays(
        [
            prep.column("trace_id").take(pa.array(dst)),
            pa.repeat(pa.scalar(build_id), n),
            _ids(prep, src),
            _ids(prep, dst),
            pa.DictionaryArray.from_arrays(pa.array(kinds), EDGE_KINDS).cast(pa.string()),
            _ids(prep, np.where(tree_edge, dst, src)),
            _ids(prep, np.where(tree_edge, src, dst)),
            *(pa.nulls(n, pa.string()) for _ in range(3)),  # src_trace_id, data_arg, data_from: data edges only
        ],
        schema=DAG_EDGES_V1,
    )


def _trace_meta(prep: pa.Table, g: Graph, edges: pa.Table, nodes: pa.Table, spec: WorkflowSpec | None) -> pa.Table:
    """Per trace: method, fallback reason, deviation reason."""
    trace_ids = prep.column("trace_id").take(pa.array(np.flatnonzero(np.diff(g.trace, prepend=-1))))
    n_traces = len(trace_ids)
    explicit = np.zeros(n_traces, dtype=np.bool_)
    explicit[g.trace[np.asarray(g.x_dst, dtype=np.int64)]] = True
    explicit[g.trace[g.step_mode & (g.parent >= 0)]] = True
    explicit[g.trace[g.step_mode & (g.parent < 0)]] = True
    method = np.where(explicit, "explicit", "inferred").astype(object)
    reasons: list[str | None] = [None] * n_traces
    for t, why in g.flat.items():
        method[t] = "flat"
        reasons[t] = why
    deviation = _deviations(edges, nodes, spec, trace_ids.to_pylist())
    return pa.table({"trace_id": trace_ids, "method": pa.array(method, pa.string()),
                     "fallback_reason": pa.array(reasons, pa.string()),
                     "deviation_reason": pa.array(deviation, pa.string())})


def _deviations(edges: pa.Table, nodes: pa.Table, spec: WorkflowSpec | None, trace_ids: list[str]) -> list[str | None]:
    if spec is None:
        return [None] * len(trace_ids)
    con = duck.connection(nodes.num_rows)
    try:
        con.register("e", edges)
        con.register("n", nodes)
        pairs = arrow(con, """
            select e.trace_id, u.spec_node as a, d.spec_node as b from e
            join n u on u.trace_id = e.trace_id and u.span_id = e.upstream_span_id
            join n d on d.trace_id = e.trace_id and d.span_id = e.downstream_span_id
            where e.edge_kind in ('sequence', 'explicit') and u.spec_node is not null and d.spec_node is not null
        """).to_pylist()
        present = arrow(con, "select distinct trace_id, spec_node from n where spec_node is not null").to_pylist()
    finally:
        con.close()
    by_pairs: dict[str, set[tuple[str, str]]] = {}
    by_nodes: dict[str, set[str]] = {}
    for r in pairs:
        by_pairs.setdefault(r["trace_id"], set()).add((r["a"], r["b"]))
    for r in present:
        by_nodes.setdefault(r["trace_id"], set()).add(r["spec_node"])
    return [spec.deviation(by_nodes.get(t, set()), by_pairs.get(t, set())) for t in trace_ids]


def assemble(
    prep: pa.Table,
    g: Graph | None,
    build_id: str,
    built_unix_nano: int,
    spec: WorkflowSpec | None,
) -> tuple[pa.Table, pa.Table, pa.Table]:
    """Return (traces, dag_nodes, dag_edges) for a finished reconstruction (``g`` None: no spans)."""
    if g is None:
        return TRACES_V1.empty_table(), DAG_NODES_V1.empty_table(), DAG_EDGES_V1.empty_table()
    nodes = nodes_table(prep, g, build_id, spec)
    edges = edges_table(prep, g, build_id)
    meta = _trace_meta(prep, g, edges, nodes, spec)
    return traces_table(prep, g, meta, build_id, built_unix_nano), nodes, edges
