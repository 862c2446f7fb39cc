"""The trace list of the web UI: ``trace_summary`` with the agent name, filtered, sorted and paged.

The agent name of a trace is the one ``run_steps`` uses: the ``agent_name`` of its earliest span
that has one, else the service name of its root span. Filters: status, agent (name), service
version, scenario, conversation, ``since`` and any run label (``key=value[,key=value]``, the syntax
of ``tracedag regress`` selections, ``store.selection``; ``sql:`` is refused here). Every result is
cached per build state, as the rest of the server's (``data.Store``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from tracedag.pipeline.serve.data import Store
from tracedag.pipeline.store.selection import FROM_SQL, SelectionSyntax, selection_condition
from tracedag.pipeline.store.views import connect
from tracedag.schemas.errors import QueryFailed

SORTS = ("start_time", "trace_id", "agent", "conversation_id", "status", "root_cause_step", "workflow_score",
         "duration_ms", "steps", "failed_steps", "service_version", "scenario_id")
MAX_PAGE = 1000

SPAN_AGENTS_SQL = """
select trace_id, arg_min(agent_name, start_time_unix_nano) as agent
from spans_all where agent_name is not null group by trace_id
"""
"""Each trace's earliest ``agent_name``, from the raw spans (the spans view's conversation id window costs a
pass over every span)."""

# One row per trace: its agent name (the earliest agent_name of its spans, else its service name). The
# service name is its latest build's, aggregated alone: the traces view keeps each trace's whole latest row
# (1.5x the CPU on 1M spans).
AGENTS_SQL = f"""
select t.trace_id, coalesce(a.agent, t.service_name) as agent
from (select trace_id, arg_max(service_name, (built_unix_nano, build_id)) as service_name
      from traces_all group by trace_id) t
left join ({SPAN_AGENTS_SQL}) a using (trace_id)
"""
"""Each built trace's agent name: the earliest ``agent_name`` of its spans, else its service name."""


@dataclass(frozen=True)
class TraceQuery:
    """One request for a page of the trace list (every filter optional)."""

    since: str | None = None
    status: str | None = None
    agent: str | None = None
    service_version: str | None = None
    scenario: str | None = None
    conversation: str | None = None
    label: str | None = None
    sort: str = "start_time"
    descending: bool = True
    limit: int = 100
    offset: int = 0


def query_from(params: dict[str, str]) -> TraceQuery:
    """A ``TraceQuery`` from request parameters; a bad value raises ``QueryFailed`` saying which."""
    sort = params.get("sort", "start_time")
    if sort not in SORTS:
        raise QueryFailed("trace_list", f"sort {sort!r} is not one of {', '.join(SORTS)}")
    order = params.get("order", "desc")
    if order not in ("asc", "desc"):
        raise QueryFailed("trace_list", "order is asc or desc")
    status = params.get("status") or None
    if status not in (None, "passed", "failed", "error"):
        raise QueryFailed("trace_list", "status is passed, failed or error")
    try:
        limit, offset = int(params.get("limit", "100")), int(params.get("offset", "0"))
    except ValueError as e:
        raise QueryFailed("trace_list", "limit and offset are integers") from e
    text = {k: (params.get(k) or None) for k in ("since", "agent", "service_version", "scenario", "conversation",
                                                  "label")}
    return TraceQuery(**text, status=status, sort=sort, descending=order == "desc",
                      limit=max(1, min(limit, MAX_PAGE)), offset=max(0, offset))


def agent_names(data: Path) -> dict[str, str]:
    """trace id -> agent name, for every built trace of the store at ``data``."""
    con = connect(data, shared_macros=False)
    try:
        rows = con.sql(AGENTS_SQL).fetchall()
    finally:
        con.close()
    return {str(tid): str(agent or "") for tid, agent in rows}


def agents(store: Store, state: str | None = None) -> dict[str, str]:
    """``agent_names`` of the store, cached per build state."""
    found: dict[str, str] = store.cache.get(state or store.state(), "trace_agents", lambda: agent_names(store.data))
    return found


def labelled(store: Store, label: str) -> set[str]:
    """The ids of the traces whose run labels match ``label`` (``key=value[,key=value]``)."""
    if label.strip().lower().startswith("sql:"):
        raise QueryFailed("trace_list", "label takes key=value[,key=value]; sql: conditions go to POST /api/sql")
    try:
        where = selection_condition(label)
    except SelectionSyntax as e:
        raise QueryFailed("trace_list", f"label {e}") from e

    def compute() -> set[str]:
        con = connect(store.data)
        try:
            return {str(r[0]) for r in con.sql(f"select t.trace_id from {FROM_SQL} where {where}").fetchall()}
        except duckdb.Error as e:  # a label naming no column: DuckDB's binder says which
            raise QueryFailed("trace_list", f"label {label!r}: {e}") from e
        finally:
            con.close()
    found: set[str] = store.cache.get(store.state(), f"label:{label}", compute)
    return found


def with_columns(store: Store, table: pa.Table) -> pa.Table:
    """``trace_summary`` rows with ``agent`` (name) and ``status`` (passed / failed / unscored) added."""
    names = agents(store)
    agent = pa.array([names.get(t, "") for t in table["trace_id"].to_pylist()], pa.string())
    passed = table["passed"].to_pylist()
    status = pa.array(["unscored" if p is None else "passed" if p else "failed" for p in passed], pa.string())
    return table.append_column("agent", agent).append_column("status", status)


def _mask(store: Store, table: pa.Table, q: TraceQuery) -> Any:
    conditions = []
    if q.status in ("passed", "failed"):
        conditions.append(pc.equal(table["passed"], q.status == "passed"))
    elif q.status == "error":
        conditions.append(pc.greater(table["error_count"], 0))
    for column, value in (("agent", q.agent), ("service_version", q.service_version), ("scenario_id", q.scenario),
                          ("conversation_id", q.conversation)):
        if value:
            conditions.append(pc.equal(table[column], value))
    if q.label:
        conditions.append(pc.is_in(table["trace_id"], pa.array(sorted(labelled(store, q.label)), pa.string())))
    mask = None
    for c in conditions:
        mask = c if mask is None else pc.and_(mask, c)
    return mask


def listed(store: Store, since: str | None) -> pa.Table:
    """``trace_summary`` with agent and status (cached per build state unless ``since`` is given)."""
    if since is not None:
        return with_columns(store, store.named("trace_summary", {}, since))
    table: pa.Table = store.cache.get(store.state(), "trace_list",
                                      lambda: with_columns(store, store.named("trace_summary", {}, None)))
    return table


def page(store: Store, q: TraceQuery) -> tuple[int, pa.Table]:
    """(matching traces, the requested page) of the trace list."""
    table = listed(store, q.since)
    mask = _mask(store, table, q)
    if mask is not None:
        table = table.filter(pc.fill_null(mask, False))
    column = "start_time_unix_nano" if q.sort == "start_time" else q.sort
    order = "descending" if q.descending else "ascending"
    table = table.sort_by([(column, order), ("trace_id", "ascending")])
    return table.num_rows, table.slice(q.offset, q.limit)


def choices(store: Store) -> dict[str, list[str]]:
    """The values the list's filters offer: agents, service versions, scenarios (sorted, nulls left out)."""
    def compute() -> dict[str, list[str]]:
        table = listed(store, None)
        out = {}
        for key, column in (("agent", "agent"), ("service_version", "service_version"), ("scenario", "scenario_id")):
            values = pc.unique(table[column]).to_pylist()
            out[key] = sorted({str(v) for v in values if v is not None and v != ""})
        return out
    found: dict[str, list[str]] = store.cache.get(store.state(), "trace_list_choices", compute)
    return found
