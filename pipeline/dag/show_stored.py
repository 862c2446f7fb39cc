"""``tracedag show``'s failure DAG of one trace from the rows stored at score time, when the store has them.

``show`` marks the greedy root cause and its path with the rows of ``failure_dag_roots`` (one per failed
step: ``nearest``, ``greedy_root_id``, ``greedy_hops``, ``final``, ``longest_chain``). Computed, that macro
reads the trace's spans, which are not sorted by trace id: every spans row group is scanned, about a
second on 1M spans. On a fresh store (``store.materialized``) the ``propagation`` rows of the trace hold
the failure DAG (``nearest_failing_upstream``, ``failing_upstream``, ``longest_chain``); the greedy walk
and the final failure are derived from them here by the rules of ``queries/_failure_graph.sql``
(``failure_dag_roots``, within one trace), with each step's depth and end from ``dag_nodes``.
"""

from __future__ import annotations

from typing import Any

import duckdb

from tracedag import queries
from tracedag.pipeline.store import freshness
from tracedag.pipeline.store.fetch import arrow
from tracedag.pipeline.store.query_macros import data_of
from tracedag.pipeline.store.querying import bind_params

_ROWS_SQL = """
select p.span_id as node, p.score, p.nearest_failing_upstream as nearest, p.longest_chain, p.recovered,
       p.cancelled, len(p.failing_upstream) as upstream, n.depth, n.start_time_unix_nano, n.end_time_unix_nano
from ({stored}) p
left join (select span_id, depth, start_time_unix_nano, end_time_unix_nano from dag_nodes where trace_id = $trace_id) n
using (span_id)
order by node
"""


def answers(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether ``cause_rows`` answers on ``con``'s store (its stored rows are current)."""
    data = data_of(con)
    return data is not None and freshness.fresh(con, data)


def cause_rows(con: duckdb.DuckDBPyConnection, trace_id: str) -> list[dict[str, Any]] | None:
    """``failure_dag_roots``' rows for ``trace_id`` (``node, score, nearest, greedy_root_id, greedy_hops,
    final, longest_chain``) from the stored ``propagation`` rows; None when they are not current."""
    data = data_of(con)
    values = bind_params(queries.describe("propagation"), {"trace_id": trace_id})
    stored = None if data is None else freshness.named_statement(con, data, "propagation", values)
    if stored is None:
        return None
    sql, params = stored
    rows: list[dict[str, Any]] = arrow(con, _ROWS_SQL.format(stored=sql), params).to_pylist()
    _greedy(rows, int(str(values["max_hops"])))
    _final(rows)
    return rows


SILENT_SQL = "select root_span_id, failed_span_id, data_arg, root_step_type from ({stored}) where silent_producer"
"""``root_causes``' silent producer of one trace (``dataflow.silent_producer`` asks it per trace, greedy)."""


def silent_statement(con: duckdb.DuckDBPyConnection, trace_id: str) -> tuple[str, dict[str, object]] | None:
    """The statement and values reading ``trace_id``'s silent producer rows (``SILENT_SQL``'s columns) from the
    stored ``root_causes`` rows (per trace, greedy: rows the scorer stores); None when they are not current."""
    data = data_of(con)
    values = bind_params(queries.describe("root_causes"), {"trace_id": trace_id, "per": "trace",
                                                             "strategy": "greedy"})
    stored = None if data is None else freshness.named_statement(con, data, "root_causes", values)
    return None if stored is None else (SILENT_SQL.format(stored=stored[0]), stored[1])


def _next_key(row: dict[str, Any]) -> tuple[Any, ...]:
    """The order of ``gnext``: lowest score, deepest, earliest start, then node key (DuckDB: nulls last)."""
    score, depth, start = row["score"], row["depth"], row["start_time_unix_nano"]
    return (score is None, score or 0.0, depth is None, -(depth or 0), start is None, start or 0, row["node"])


def _greedy(rows: list[dict[str, Any]], max_hops: int) -> None:
    """Add ``greedy_root_id`` and ``greedy_hops``: from each step, move to its lowest failing upstream step
    (``_next_key``) until none is left, at most ``max_hops`` moves."""
    steps = {r["node"]: r for r in rows}
    step_after = {}
    for r in rows:
        ups = [steps[u] for u in r["nearest"] or [] if u in steps]
        if ups:
            step_after[r["node"]] = min(ups, key=_next_key)["node"]
    for r in rows:
        here, hops = r["node"], 0
        while hops < max_hops and here in step_after:
            here, hops = step_after[here], hops + 1
        r["greedy_root_id"], r["greedy_hops"] = here, hops


def _final(rows: list[dict[str, Any]]) -> None:
    """Mark the final failure: not recovered, no failure downstream; not cancelled first, then the most
    failures upstream, the latest end, the node key."""
    upstream_of_some = {u for r in rows for u in r["nearest"] or []}
    candidates = [r for r in rows if not r["recovered"] and r["node"] not in upstream_of_some]
    for r in rows:
        r["final"] = False
    if candidates:
        best = min(candidates, key=lambda r: (bool(r["cancelled"]), -(r["upstream"] or 0),
                                              r["end_time_unix_nano"] is None, -(r["end_time_unix_nano"] or 0),
                                              r["node"]))
        best["final"] = True
