"""Explicit edges (span links, execution ids, graph node parents) and the traces that carry them.

The common path (call tree + sibling order) is vectorized; a trace with explicit cross edges is
finished here with networkx, one small graph per trace, in the dependency direction
(upstream -> downstream): explicit edges and the call tree first, then the inferred sibling edges
that do not contradict them, then only the inferred edges no other path implies.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import duckdb
import networkx as nx
import numpy as np

from tracedag.pipeline.dag.siblings import arrow
from tracedag.pipeline.dag.tree import IntArray

logger = logging.getLogger(__name__)

# src happened before dst, both rows of prep in the same trace
_EXPLICIT_SQL = """
with l as (
    select idx, trace_no, trace_id, unnest(links) as lk from prep where len(links) > 0
), g as (
    select t.idx as src, c.idx as dst,
           row_number() over (partition by c.idx order by t.s desc, t.idx desc) as rn
    from prep c join prep t
      on t.trace_no = c.trace_no and t.graph_node_id = c.graph_node_parent_id and t.idx <> c.idx and t.s <= c.s
)
select t.idx as src, l.idx as dst from l join prep t
  on t.trace_no = l.trace_no and t.span_id = l.lk.span_id and l.lk.trace_id = l.trace_id
union
select t.idx, c.idx from prep c join prep t
  on t.trace_no = c.trace_no and t.node_execution_id = c.previous_execution_id and t.idx <> c.idx
union
select src, dst from g where rn = 1
"""


def explicit_edges(con: duckdb.DuckDBPyConnection, left: IntArray, right: IntArray) -> tuple[IntArray, IntArray]:
    """Explicit src -> dst edges between rows of the registered ``prep`` table.

    Edges between a span and its own call-tree ancestor or descendant are dropped: the call tree
    already relates them, and an edge against it would only make a cycle.
    """
    t = arrow(con, _EXPLICIT_SQL)
    src = np.asarray(t.column("src").to_numpy(zero_copy_only=False), dtype=np.int64)
    dst = np.asarray(t.column("dst").to_numpy(zero_copy_only=False), dtype=np.int64)
    nested = ((left[src] < left[dst]) & (right[dst] < right[src])) | (
        (left[dst] < left[src]) & (right[src] < right[dst])
    )
    keep = ~nested & (src != dst)
    return src[keep], dst[keep]


@dataclass
class TraceGraph:
    """The edges of one trace with explicit edges, before resolution (row numbers)."""

    rows: list[int]
    parent: list[tuple[int, int]] = field(default_factory=list)  # (child, parent)
    explicit: list[tuple[int, int]] = field(default_factory=list)  # (src, dst)
    sequence: list[tuple[int, int]] = field(default_factory=list)  # (src, dst), in sibling order


@dataclass(frozen=True)
class Resolved:
    """Outcome for one trace: kept edges and a topological order, or a flat fallback with its reason."""

    explicit: list[tuple[int, int]]
    sequence: list[tuple[int, int]]
    topo: list[int]
    contradicted: int
    fallback_reason: str | None


def resolve(g: TraceGraph, sort_key: dict[int, int]) -> Resolved:
    """Combine explicit, call-tree and sibling edges of one trace into one acyclic dependency graph."""
    dep = nx.DiGraph()
    dep.add_nodes_from(g.rows)
    dep.add_edges_from(g.parent)
    dep.add_edges_from(g.explicit)
    try:
        cycle = nx.find_cycle(dep)
    except nx.NetworkXNoCycle:
        cycle = None
    if cycle is not None:
        return Resolved([], [], [], 0, f"cycle in explicit edges through {len(cycle)} spans")
    explicit = set(g.explicit)
    kept: list[tuple[int, int]] = []
    contradicted = 0
    for a, b in g.sequence:
        if (a, b) in explicit:
            continue
        if nx.has_path(dep, b, a):
            contradicted += 1
            continue
        dep.add_edge(a, b)
        kept.append((a, b))
    reduced = [e for e in kept if not _implied(dep, e)]
    topo = list(nx.lexicographical_topological_sort(dep, key=lambda r: sort_key[r]))
    return Resolved(sorted(explicit), reduced, topo, contradicted, None)


def _implied(dep: nx.DiGraph, edge: tuple[int, int]) -> bool:
    """True when ``edge`` is implied by another path; removes it from ``dep`` in that case."""
    dep.remove_edge(*edge)
    if nx.has_path(dep, *edge):
        return True
    dep.add_edge(*edge)
    return False
