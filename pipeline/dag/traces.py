"""The ``traces`` rows of one reconstruction, aggregated per trace with numpy (rows of a trace are contiguous)."""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracedag.pipeline.dag.graph import Graph
from tracedag.pipeline.dag.tree import IntArray
from tracedag.schemas.tables import TRACES_V1

logger = logging.getLogger(__name__)

# copied from the first span (call-tree pre-order) that has them
LABELS = ["service_name", "service_version", "conversation_id", "run_id", "scenario_id", "replay_index", "variant_id"]


def _first_valid(col: pa.ChunkedArray, order: IntArray, trace: IntArray, n_traces: int) -> pa.Array:
    valid = np.asarray(pc.is_valid(col).to_numpy(zero_copy_only=False), dtype=np.bool_)[order]
    rows = order[valid]
    found, pos = np.unique(trace[rows], return_index=True)
    take = np.full(n_traces, -1, dtype=np.int64)
    take[found] = rows[pos]
    return col.take(pa.array(take, mask=take < 0)).combine_chunks()


def _primary_roots(g: Graph) -> IntArray:
    """Per trace, the root that is not an orphan and starts first (else the first root)."""
    r = np.flatnonzero(g.parent < 0)
    r = r[np.lexsort((r, g.eff_s[r], g.orphan[r], g.trace[r]))]
    _, first = np.unique(g.trace[r], return_index=True)
    return r[first]


def traces_table(prep: pa.Table, g: Graph, meta: pa.Table, build_id: str, built_unix_nano: int) -> pa.Table:
    """One ``traces`` row per trace (``meta``: method, fallback_reason, deviation_reason in trace order)."""
    starts = np.flatnonzero(np.diff(g.trace, prepend=-1))
    n_traces = starts.size

    def seg_sum(x: np.ndarray) -> IntArray:
        """Sum of ``x`` over the rows of each trace."""
        return np.add.reduceat(x.astype(np.int64), starts)

    received = np.asarray(prep.column("received_unix_nano").to_numpy(zero_copy_only=False), dtype=np.int64)
    raw_root = ~np.asarray(prep.column("has_parent_ref").to_numpy(zero_copy_only=False), dtype=np.bool_)
    start = np.minimum.reduceat(g.eff_s, starts)
    end = np.maximum.reduceat(g.eff_e, starts)
    orphans = seg_sum(g.orphan)
    deviation = meta.column("deviation_reason")
    order = np.lexsort((g.left, g.trace))
    cols: dict[str, pa.Array | pa.ChunkedArray | np.ndarray] = {
        "trace_id": prep.column("trace_id").take(pa.array(starts)),
        "build_id": pa.repeat(pa.scalar(build_id), n_traces),
        "built_unix_nano": np.full(n_traces, built_unix_nano, dtype=np.int64),
        "last_received_unix_nano": np.maximum.reduceat(received, starts),
        "root_span_id": prep.column("span_id").take(pa.array(_primary_roots(g))),
        "start_time_unix_nano": start,
        "end_time_unix_nano": end,
        "duration_ns": end - start,
        "span_count": np.diff(np.append(starts, g.trace.size)),
        "error_count": seg_sum(np.asarray(prep.column("status_code").to_numpy(zero_copy_only=False)) == 2),
        "root_count": seg_sum(g.parent < 0),
        "orphan_count": orphans,
        "clock_skew_count": seg_sum(g.skew),
        "connected": (seg_sum(raw_root) == 1) & (orphans == 0),
        "method": meta.column("method"),
        "fallback_reason": meta.column("fallback_reason"),
        "deviant": pc.is_valid(deviation),
        "deviation_reason": deviation,
    }
    for c in LABELS:
        cols[c] = _first_valid(prep.column(c), order, g.trace, n_traces)
    return pa.Table.from_arrays([_typed(cols[f.name], f.type) for f in TRACES_V1], schema=TRACES_V1)


def _typed(v: pa.Array | pa.ChunkedArray | np.ndarray, t: pa.DataType) -> pa.Array | pa.ChunkedArray:
    if isinstance(v, np.ndarray):
        return pa.array(v).cast(t)
    return v.cast(t)
