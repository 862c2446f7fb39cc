"""The runs structural validation reads: their steps as states, their labels, and whether they passed.

A run is what ``trajectories`` calls a run (``queries/run_steps.sql``: all traces sharing
``run_id``, else ``conversation_id``; a trace without either is a run of its own), with the same
agent and scenario (``--by``: a SQL expression over the root span, as ``--group-by`` of
``tracedag determinism``, see ``trajectories.group_keys``). Its steps are the graph-node visits and
tool calls of ``run_steps``, ordered by trace, then start time, then call-tree depth (a node
before the tools it calls), with their DAG step key from ``dag_nodes``.

A run *passed* when none of its traces is a failed trace: a trace with a root cause in
``queries/root_causes.sql`` (a non-recovered failing step; a failure a retry recovered does not
count), the same definition ``tracedag demo`` and ``trace_summary`` use.

``--state`` picks the abstraction that turns a step into a state name (``STATES``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb

from tracedag import queries
from tracedag.pipeline.analysis.trajectories import UNLABELLED, group_keys
from tracedag.pipeline.store.querying import bind_params, query_doc
from tracedag.pipeline.store.selection import FROM_SQL, SelectionSyntax
from tracedag.pipeline.store.selection import selection_condition as store_selection_condition
from tracedag.schemas.errors import QueryFailed, TracedagError

logger = logging.getLogger(__name__)

STATES: dict[str, str] = {
    "step_key": "graph nodes and tool calls, named by their DAG step key below the agent's root "
                "(router, check_availability/calendar_search)",
    "step_name": "graph nodes and tool calls, by step name (router, calendar_search)",
    "step_type:step_name": "graph nodes and tool calls, by step type and name (chain:router, tool:calendar_search)",
    "node": "graph-node visits only, by node name (the node path of tracedag determinism)",
    "tool": "tool calls only, by tool name (the action path of tracedag determinism)",
}
"""The state abstractions: name -> what a state is."""
DEFAULT_STATE = "step_key"



class NotReady(TracedagError):  # type: ignore[misc,unused-ignore]
    """The store lacks what validation needs (built DAGs, step scores)."""

    def __init__(self, what: str, fix: str) -> None:
        super().__init__(f"{what}: {fix}")
        self.what = what


class BadSelection(TracedagError):  # type: ignore[misc,unused-ignore]
    """A ``--runs`` selection could not be read or selects nothing."""

    def __init__(self, selection: str, reason: str) -> None:
        super().__init__(f"--runs {selection!r}: {reason}")
        self.selection = selection


@dataclass(frozen=True)
class Step:
    """One step of a run: a graph-node visit or a tool call."""

    kind: str  # node | tool
    name: str
    step_type: str | None
    step_key: str | None
    start_ns: int
    end_ns: int

    @property
    def duration_ns(self) -> int:
        """End - start, never negative."""
        return max(0, self.end_ns - self.start_ns)


@dataclass
class RunSteps:
    """One run: labels, steps in order, its final reply, and whether it passed."""

    run_key: str
    agent: str
    agent_version: str | None
    scenario: str
    start_ns: int
    trace_ids: list[str] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    responses: list[str | None] = field(default_factory=list)
    passed: bool = True

    @property
    def final_response(self) -> str | None:
        """The response of the last turn that has one."""
        return next((r for r in reversed(self.responses) if r), None)


def state_name(step: Step, state: str) -> str | None:
    """The state a step stands for under the abstraction ``state``; None when it is not a state."""
    if state == "node":
        return step.name if step.kind == "node" else None
    if state == "tool":
        return step.name if step.kind == "tool" else None
    if state == "step_name":
        return step.name
    if state == "step_type:step_name":
        return f"{step.step_type or step.kind}:{step.name}"
    key = step.step_key
    if not key or "/" not in key:
        return step.name
    return key.split("/", 1)[1]  # below the root (the agent itself)


def states_of(run: RunSteps, state: str) -> list[tuple[str, Step]]:
    """The run's (state name, step) sequence under ``state``."""
    out: list[tuple[str, Step]] = []
    for step in run.steps:
        name = state_name(step, state)
        if name is not None:
            out.append((name, step))
    return out


# Glue over the named query run_steps: the DAG step key and depth of each step, and the run order.
_STEPS_SQL = """
select rs.run_key, rs.trace_id, rs.kind, rs.name, rs.detail, rs.agent, rs.agent_version, rs.scenario,
       rs.trace_start, rs.start_time_unix_nano, rs.end_time_unix_nano,
       d.step_key, cast(d.step_type as varchar) as step_type, d.depth
from ({run_steps}) rs
left join dag_nodes d on d.trace_id = rs.trace_id and d.span_id = rs.span_id
order by rs.run_key, rs.trace_start, rs.trace_id, rs.kind = 'response', rs.start_time_unix_nano,
         d.depth nulls last, rs.name, rs.span_id
"""


def load_run_steps(
    con: duckdb.DuckDBPyConnection, by: str | None = None, selection: str | None = None
) -> list[RunSteps]:
    """Every run in the views on ``con`` (or those ``selection`` picks), with steps and pass/fail."""
    _require_built(con)
    chosen = select_traces(con, selection) if selection else None
    keys = group_keys(con, by) if by else None
    try:
        cur = con.execute(_STEPS_SQL.format(run_steps=queries.load("run_steps")))
    except duckdb.Error as e:
        raise QueryFailed("run_steps", str(e)) from e
    cols = [d[0] for d in cur.description]
    runs: dict[str, RunSteps] = {}
    for values in cur.fetchall():
        row = dict(zip(cols, values, strict=True))
        if keys is not None:
            row["scenario"] = keys.get(row["trace_id"])
        run = runs.get(row["run_key"])
        if run is None:
            run = runs[row["run_key"]] = _new_run(row)
        _add(run, row)
    found = [r for r in runs.values() if chosen is None or any(t in chosen for t in r.trace_ids)]
    if selection and not found:
        raise BadSelection(selection, "selects no run")
    failed = failed_traces(con)
    for run in found:
        run.passed = not any(t in failed for t in run.trace_ids)
    return sorted(found, key=lambda r: (r.start_ns, r.run_key))


def _new_run(row: dict[str, Any]) -> RunSteps:
    scenario = row["scenario"] if row["scenario"] is not None else UNLABELLED
    return RunSteps(row["run_key"], row["agent"], row["agent_version"], str(scenario), row["trace_start"] or 0)


def _add(run: RunSteps, row: dict[str, Any]) -> None:
    if not run.trace_ids or run.trace_ids[-1] != row["trace_id"]:
        run.trace_ids.append(row["trace_id"])
    if row["kind"] == "response":
        run.responses.append(row["detail"])
        return
    run.steps.append(Step(row["kind"], str(row["name"]), row["step_type"], row["step_key"],
                          row["start_time_unix_nano"] or 0, row["end_time_unix_nano"] or 0))


def _require_built(con: duckdb.DuckDBPyConnection) -> None:
    spans, traces, scores = con.execute(
        "select (select count(*) from spans), (select count(*) from traces), (select count(*) from step_scores)"
    ).fetchone() or (0, 0, 0)
    if not spans:
        raise NotReady("the store holds no spans", "collect or ingest spans first (tracedag collect, tracedag ingest)")
    if not traces:
        raise NotReady("no execution DAGs built", "run tracedag build first")
    if not scores:
        raise NotReady("no step scores", "run tracedag score first (passing runs are told from failed ones by them)")


def failed_traces(con: duckdb.DuckDBPyConnection) -> set[str]:
    """Trace ids of the failed traces: one root cause each (``queries/root_causes.sql``, per trace)."""
    params = bind_params(query_doc("root_causes"), {"per": "trace"})
    try:
        rows = con.execute(f"select distinct trace_id from ({queries.load('root_causes')})", params).fetchall()
    except duckdb.Error as e:
        raise QueryFailed("root_causes", str(e)) from e
    return {r[0] for r in rows}


_SELECT_SQL = f"select distinct t.trace_id from {FROM_SQL} where {{where}}"


def selection_condition(selection: str) -> str:
    """The SQL condition of a ``--runs`` selection (``tracedag.pipeline.store.selection``: the
    syntax of ``tracedag regress --baseline/--candidate``)."""
    try:
        return store_selection_condition(selection)
    except SelectionSyntax as e:
        raise BadSelection(selection, e.reason) from e


def select_traces(con: duckdb.DuckDBPyConnection, selection: str) -> set[str]:
    """Trace ids of the built traces ``selection`` picks (``selection_condition``)."""
    try:
        rows = con.execute(_SELECT_SQL.format(where=selection_condition(selection))).fetchall()
    except duckdb.Error as e:
        raise BadSelection(selection, str(e).splitlines()[0]) from e
    return {r[0] for r in rows}


def agents_of(runs: Sequence[RunSteps]) -> list[str]:
    """The distinct agents of ``runs``, sorted."""
    return sorted({r.agent for r in runs})
