"""DAG reconstruction: a pure function from the spans of complete traces to traces/dag_nodes/dag_edges.

``reconstruct(spans, build_id, built_unix_nano)`` works on any number of traces at once; nothing in
the result depends on the order of the input rows or on how a trace's spans were batched.
Steps (docs/pages/dags.md, "Execution DAGs"):

1. dedupe (trace_id, span_id), sort rows by (trace_id, start, span_id), resolve parents;
2. repair the call tree: break parent cycles, attach orphans to the span enclosing them in time,
   shift subtrees that start before their parent (clock skew);
3. order siblings (LangGraph super-steps where present, else timestamps with a tolerance);
4. nested sets, topological index, parallel branches, loop iterations;
5. explicit edges (links, execution ids, graph node parents) resolved per trace with networkx;
   a cycle among them makes the trace flat (call tree only), with the reason.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracedag.pipeline.dag import duck, loops, tree
from tracedag.pipeline.dag.explicit import TraceGraph, explicit_edges, resolve
from tracedag.pipeline.dag.graph import Graph
from tracedag.pipeline.dag.output import assemble
from tracedag.pipeline.dag.prep import INPUT_COLUMNS, prepare_table
from tracedag.pipeline.dag.siblings import DEFAULT_TOLERANCE_NS, SiblingOrder, sibling_order
from tracedag.pipeline.dag.spec import WorkflowSpec
from tracedag.pipeline.dag.timing import stage
from tracedag.pipeline.dag.toolcalls import agent_groups, tool_call_edges
from tracedag.pipeline.dag.tree import BoolArray, IntArray

logger = logging.getLogger(__name__)

__all__ = ["DEFAULT_TOLERANCE_NS", "INPUT_COLUMNS", "reconstruct"]


@dataclass
class Frame:
    """One chunk of spans as numpy arrays (row = idx in ``prep``)."""

    prep: pa.Table
    trace: IntArray
    parent: IntArray
    s: IntArray
    e: IntArray
    failed: BoolArray
    trace_lo: IntArray
    trace_hi: IntArray

    @property
    def n(self) -> int:
        """Number of rows."""
        return int(self.trace.size)


def _np(t: pa.Table, name: str) -> IntArray:
    return np.asarray(t.column(name).to_numpy(zero_copy_only=False), dtype=np.int64)


def prepare(con: duckdb.DuckDBPyConnection, spans: pa.Table) -> Frame:
    """Dedupe, sort and index the spans; register them as ``prep`` on ``con``."""
    prep = prepare_table(spans)
    con.register("prep", prep)
    trace = _np(prep, "trace_no")
    bounds = np.flatnonzero(np.diff(trace, prepend=-1, append=trace.size + 1 if trace.size else 1))
    lo = np.repeat(bounds[:-1], np.diff(bounds)) if trace.size else trace
    hi = np.repeat(bounds[1:], np.diff(bounds)) if trace.size else trace
    return Frame(
        prep=prep,
        trace=trace,
        parent=_np(prep, "parent_idx"),
        s=_np(prep, "s"),
        e=_np(prep, "e"),
        failed=_np(prep, "status_code") == 2,
        trace_lo=lo.astype(np.int64),
        trace_hi=hi.astype(np.int64),
    )


@dataclass
class CallTree:
    """The repaired call tree."""

    parent: IntArray
    levels: tree.Levels
    orphan: BoolArray
    attached: BoolArray  # orphan re-attached under a span (edge kind orphan_attach)
    true_root: BoolArray
    eff_s: IntArray
    eff_e: IntArray
    skew: BoolArray


def repair(f: Frame, has_ref: BoolArray, tolerance: int) -> CallTree:
    """Break parent cycles, attach orphans by time, clamp clock skew."""
    parent = f.parent.copy()
    orphan = has_ref & (parent < 0)
    lv = tree.levels(parent)
    while (lv.depth < 0).any():
        cut = np.asarray(tree.cycle_members(parent, lv.depth), dtype=np.int64)
        logger.info("breaking %d parent cycles", cut.size)
        parent[cut] = -1
        orphan[cut] = True
        lv = tree.levels(parent)
    true_root = (parent < 0) & ~orphan
    main = true_root[lv.component]
    rows = np.flatnonzero(orphan)
    target = tree.attach_orphans(rows, f.trace_lo, f.trace_hi, main, lv.depth, f.s, f.e)
    attached = np.zeros(f.n, dtype=np.bool_)
    attached[rows[target >= 0]] = True
    parent[rows[target >= 0]] = target[target >= 0]
    if attached.any():
        lv = tree.levels(parent)
    eff_s, eff_e, skew = tree.clamp_skew(parent, lv.by_depth, f.s, f.e, tolerance, remote_calls(f.prep, parent))
    return CallTree(parent, lv, orphan, attached, true_root, eff_s, eff_e, skew)


SERVER, CLIENT = 2, 3  # OTLP SpanKind


def remote_calls(prep: pa.Table, parent: IntArray) -> BoolArray:
    """Rows that start another service's part of a remote call: a SERVER span, or any span under a
    CLIENT span, whose ``service_name`` differs from its parent's (the other service's clock)."""
    has = parent >= 0
    if not has.any():
        return np.zeros(parent.size, dtype=np.bool_)
    p = pa.array(np.maximum(parent, 0))
    service = prep.column("service_name")
    other = pc.fill_null(pc.not_equal(service, service.take(p)), False).to_numpy(zero_copy_only=False)
    kind = np.asarray(prep.column("kind").to_numpy(zero_copy_only=False), dtype=np.int64)
    call = (kind == SERVER) | (kind[np.maximum(parent, 0)] == CLIENT)
    out: BoolArray = has & np.asarray(other, dtype=np.bool_) & call
    return out


def _sibling_input(f: Frame, ct: CallTree) -> tuple[pa.Table, IntArray]:
    """The ``sib`` table for sibling ordering and the group of each row (roots grouped per trace)."""
    group = np.where(ct.parent >= 0, ct.parent, f.n + f.trace)
    p = np.maximum(ct.parent, 0)
    step = f.prep.column("langgraph_step")
    node = f.prep.column("langgraph_node")
    no_parent = pa.array(ct.parent < 0)
    sib = pa.table(
        {
            "idx": np.arange(f.n, dtype=np.int64),
            "grp": group,
            "s": ct.eff_s,
            "e": ct.eff_e,
            "step": step,
            "node": node,
            "pstep": pc.if_else(no_parent, pa.nulls(f.n, pa.int64()), step.take(pa.array(p))),
            "pnode": pc.if_else(no_parent, pa.nulls(f.n, pa.string()), node.take(pa.array(p))),
        }
    )
    return sib, group


def _sibling_sort(f: Frame, ct: CallTree, group: IntArray, order: SiblingOrder) -> IntArray:
    """All rows sorted by (group, stage, effective start, effective end, row)."""
    return np.lexsort((np.arange(f.n), ct.eff_e, ct.eff_s, order.n_pred, group)).astype(np.int64)


def reconstruct(
    spans: pa.Table,
    build_id: str,
    built_unix_nano: int,
    tolerance_ns: int = DEFAULT_TOLERANCE_NS,
    spec: WorkflowSpec | None = None,
) -> tuple[pa.Table, pa.Table, pa.Table]:
    """Build (traces, dag_nodes, dag_edges) tables for the complete traces in ``spans``."""
    con = duck.connection(spans.num_rows)
    try:
        with stage("prepare"):
            f = prepare(con, spans)
        del spans  # the caller passes the only reference: free the input before the heavy steps
        if f.n == 0:
            empty: tuple[pa.Table, pa.Table, pa.Table] = assemble(f.prep, None, build_id, built_unix_nano, spec)
            return empty
        has_ref = f.prep.column("has_parent_ref").to_numpy(zero_copy_only=False).astype(np.bool_)
        with stage("repair"):
            ct = repair(f, has_ref, tolerance_ns)
        with stage("siblings"):
            sib, group = _sibling_input(f, ct)
            order = sibling_order(con, sib, tolerance_ns)
        with stage("tree"):
            sorted_rows = _sibling_sort(f, ct, group, order)
            left, right = tree.nested_sets(ct.parent, ct.levels.by_depth, sorted_rows, group)
        with stage("loops+explicit"):
            graph = _graph(con, f, ct, order, left, right)
        with stage("assemble"):
            out: tuple[pa.Table, pa.Table, pa.Table] = assemble(f.prep, graph, build_id, built_unix_nano, spec)
        return out
    finally:
        con.close()


def _graph(
    con: duckdb.DuckDBPyConnection, f: Frame, ct: CallTree, order: SiblingOrder, left: IntArray, right: IntArray,
) -> Graph:
    """Everything per row and per edge that the output tables need."""
    names = f.prep.column("step_name").combine_chunks().dictionary_encode()
    local = np.asarray(names.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
    key, key_texts = loops.step_keys(ct.parent, ct.levels.by_depth, local, names.dictionary.to_pylist())
    prank = loops.path_ranks(ct.parent, ct.levels.by_depth, order.n_pred)
    ops = f.prep.column("op_name").combine_chunks().dictionary_encode()
    op = np.asarray(ops.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
    iteration, retry = loops.iterations(f.trace, key, prank, f.failed, op)
    branch = loops.branches(
        ct.parent, ct.levels.by_depth, f.trace, left, order.concurrent, order.src, order.dst
    )
    g = Graph(
        trace=f.trace, parent=ct.parent, depth=ct.levels.depth, left=left, right=right,
        topo=tree.rank_within(f.trace, right), branch=branch, key=key, key_texts=key_texts,
        iteration=iteration, retry=retry, orphan=ct.orphan, attached=ct.attached, skew=ct.skew,
        true_root=ct.true_root, eff_s=ct.eff_s, eff_e=ct.eff_e,
        seq_src=order.src, seq_dst=order.dst, step_mode=order.step_mode,
    )
    x_src, x_dst = explicit_edges(con, left, right)
    if x_src.size:
        _apply_explicit(f, g, x_src, x_dst)
    is_agent = np.asarray(pc.fill_null(pc.equal(f.prep.column("step_type"), "agent"), False)
                          .to_numpy(zero_copy_only=False), dtype=np.bool_)
    g.agent_group = agent_groups(ct.parent, ct.levels.by_depth, is_agent, f.trace)
    g.tc_src, g.tc_dst = _tool_calls(con, f, ct, g.agent_group, left, right)
    return g


def _tool_calls(con: duckdb.DuckDBPyConnection, f: Frame, ct: CallTree, group: IntArray, left: IntArray,
                right: IntArray) -> tuple[IntArray, IntArray]:
    """The tool_call edges (LLM row -> tool row), none between a span and its own ancestor."""
    src, dst = tool_call_edges(con, f.prep, group, ct.eff_s, ct.eff_e)
    nested = ((left[src] < left[dst]) & (right[dst] < right[src])) | ((left[dst] < left[src]) & (right[src] < right[dst]))
    return src[~nested], dst[~nested]


def _apply_explicit(f: Frame, g: Graph, x_src: IntArray, x_dst: IntArray) -> None:
    """Resolve the traces that carry explicit edges one by one; update ``g`` in place."""
    traces = np.unique(f.trace[x_src])
    involved = np.isin(f.trace, traces)
    keep_seq = ~involved[g.seq_src]
    seq_src, seq_dst = list(g.seq_src[~keep_seq]), list(g.seq_dst[~keep_seq])
    by_trace: dict[int, TraceGraph] = {}
    for t in traces.tolist():
        rows = range(int(f.trace_lo[np.searchsorted(f.trace, t)]), int(f.trace_hi[np.searchsorted(f.trace, t)]))
        by_trace[t] = TraceGraph(rows=list(rows))
        by_trace[t].parent = [(r, int(g.parent[r])) for r in rows if g.parent[r] >= 0]
    for a, b in zip(x_src.tolist(), x_dst.tolist(), strict=True):
        by_trace[int(f.trace[a])].explicit.append((a, b))
    for a, b in sorted(zip(seq_src, seq_dst, strict=True), key=lambda e: (g.right[e[1]], g.right[e[0]])):
        by_trace[int(f.trace[a])].sequence.append((int(a), int(b)))
    new_src: list[int] = []
    new_dst: list[int] = []
    for t, tg in by_trace.items():
        res = resolve(tg, {r: int(g.right[r]) for r in tg.rows})
        g.record_explicit(t, tg.rows, res)
        new_src += [a for a, _ in res.sequence]
        new_dst += [b for _, b in res.sequence]
    g.seq_src = np.concatenate([g.seq_src[keep_seq], np.asarray(new_src, dtype=np.int64)])
    g.seq_dst = np.concatenate([g.seq_dst[keep_seq], np.asarray(new_dst, dtype=np.int64)])
