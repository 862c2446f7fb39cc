"""Per-run trajectories from the store: node paths, tool-call paths, tool+argument paths, responses.

A run is one conversation (all traces sharing ``run_id``, else ``conversation_id``) or a single
trace without either; its traces come in start order (``turns`` counts the user turns, see
``Run.turns``). Its node path is the ordered list of graph-node
visits across turns (trace start time, then DAG topological index, then span start time); which
spans count as nodes is documented in ``queries/run_steps.sql``. Visits of one turn that overlap
in time, or run in the same LangGraph super-step, are parallel branches (a LangGraph ``Send`` fan-out, say): they are ordered by node name,
so the path does not depend on which branch started first, and the step from one to the next is
not a transition. ``runs_table`` and
``visits_table`` turn the runs into Arrow relations for the SQL in ``queries/``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb
import pyarrow as pa

from tracedag import queries
from tracedag.pipeline.analysis.canonical import action_with_input
from tracedag.schemas.agent_graph import AgentGraph, graph_for
from tracedag.schemas.errors import QueryFailed

logger = logging.getLogger(__name__)

UNLABELLED = "(unlabelled)"


@dataclass
class Run:
    """One run (conversation) with its trajectories."""

    run_key: str
    agent: str
    agent_version: str | None
    scenario: str
    variant_id: str | None
    replay_index: int | None
    start_ns: int
    nodes: list[str] = field(default_factory=list)
    node_failed: list[bool] = field(default_factory=list)
    node_turn: list[int] = field(default_factory=list)
    node_parallel: list[bool] = field(default_factory=list)
    """True when the visit overlaps in time the one before it in the same turn (parallel branch)."""
    node_times: list[tuple[int, int]] = field(default_factory=list, repr=False)
    node_steps: list[int | None] = field(default_factory=list, repr=False)
    actions: list[str] = field(default_factory=list)
    action_inputs: list[str] = field(default_factory=list)
    responses: list[str | None] = field(default_factory=list)
    user_inputs: list[str | None] = field(default_factory=list)
    """Per trace, the user's message it answers (``run_steps.sql``: user_input)."""
    intended_path: list[str] | None = None
    trace_ids: list[str] = field(default_factory=list)

    @property
    def is_base(self) -> bool:
        """True for an exact replay (no variant id)."""
        return not self.variant_id

    @property
    def turns(self) -> int:
        """Number of user turns: traces whose user message differs from the previous one's (EDGE);
        the number of traces when no user message was captured."""
        said = [u for u in self.user_inputs if u]
        if not said:
            return len(self.trace_ids)
        return 1 + sum(1 for a, b in zip(said, said[1:], strict=False) if a != b)

    @property
    def final_response(self) -> str | None:
        """The response of the last turn that has one."""
        return next((r for r in reversed(self.responses) if r), None)


def group_keys(con: duckdb.DuckDBPyConnection, group_by: str) -> dict[str, str | None]:
    """``trace_id -> (group_by expression over the trace's root span)``, as text."""
    sql = f"select trace_id, cast(({group_by}) as varchar) from spans where parent_span_id is null"
    try:
        return dict(con.execute(sql).fetchall())
    except duckdb.Error as e:
        raise QueryFailed("group-by", f"bad --group-by expression {group_by!r}: {e}") from e


def _intended(text: object) -> list[str] | None:
    if not isinstance(text, str):
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        logger.warning("tracedag.intended_path is not JSON: %r", text[:80])
        return None
    return [str(v) for v in value] if isinstance(value, list) else None


def _new_run(row: dict[str, Any]) -> Run:
    return Run(
        run_key=row["run_key"], agent=row["agent"], agent_version=row["agent_version"],
        scenario=row["scenario"] if row["scenario"] is not None else UNLABELLED,
        variant_id=row["variant_id"] or None, replay_index=row["replay_index"],
        start_ns=row["trace_start"] or 0, intended_path=_intended(row["intended_path"]),
    )


def _add_step(run: Run, row: dict[str, Any]) -> None:
    if not run.trace_ids or run.trace_ids[-1] != row["trace_id"]:
        run.trace_ids.append(row["trace_id"])
    if run.intended_path is None:
        run.intended_path = _intended(row["intended_path"])
    kind = row["kind"]
    if kind == "node":
        run.nodes.append(row["name"])
        run.node_failed.append(bool(row["failed"]))
        run.node_turn.append(len(run.trace_ids) - 1)
        run.node_times.append((row["start_time_unix_nano"] or 0, row["end_time_unix_nano"] or 0))
        run.node_steps.append(row["langgraph_step"])
    elif kind == "tool":
        run.actions.append(row["name"])
        run.action_inputs.append(action_with_input(row["name"], row["detail"]))
    else:
        run.responses.append(row["detail"])
        run.user_inputs.append(row.get("user_input"))


_FETCH_ROWS = 20_000


def load_runs(
    con: duckdb.DuckDBPyConnection, group_by: str | None = None, progress: Callable[[int], None] | None = None
) -> list[Run]:
    """Read every run from the views on ``con`` (``queries/run_steps.sql``), in run-start order.

    ``group_by``: a SQL expression over the root span that replaces ``scenario_id`` as the
    scenario of a run (the value on the run's first trace). ``progress(n)``: ``n`` more steps read.
    """
    keys = group_keys(con, group_by) if group_by else None
    try:
        cur = con.execute(queries.load("run_steps"))
    except duckdb.Error as e:
        raise QueryFailed("run_steps", str(e)) from e
    cols = [d[0] for d in cur.description]
    runs: dict[str, Run] = {}
    while chunk := cur.fetchmany(_FETCH_ROWS):
        for values in chunk:
            row = dict(zip(cols, values, strict=True))
            if keys is not None:
                row["scenario"] = keys.get(row["trace_id"])
            run = runs.get(row["run_key"])
            if run is None:
                run = runs[row["run_key"]] = _new_run(row)
            _add_step(run, row)
        if progress is not None:
            progress(len(chunk))
    for run in runs.values():
        settle_parallel(run)
    logger.info("loaded %d runs", len(runs))
    return sorted(runs.values(), key=lambda r: (r.start_ns, r.run_key))


def _parallel_groups(run: Run) -> list[list[int]]:
    """Consecutive visits of one turn that overlap in time, or share a LangGraph super-step, form a
    group (parallel branches)."""
    groups: list[list[int]] = []
    group_end = 0
    for i, (start, end) in enumerate(run.node_times):
        prev = groups[-1][-1] if groups else None
        same_turn = prev is not None and run.node_turn[prev] == run.node_turn[i]
        step = run.node_steps[i] if i < len(run.node_steps) else None
        same_step = prev is not None and step is not None and run.node_steps[prev] == step
        if same_turn and (start < group_end or same_step):
            groups[-1].append(i)
            group_end = max(group_end, end)
        else:
            groups.append([i])
            group_end = end
    return groups


def settle_parallel(run: Run) -> None:
    """Order each group of parallel visits by node name (stable across runs) and flag them."""
    if len(run.node_times) != len(run.nodes):
        run.node_parallel = [False] * len(run.nodes)
        return
    order: list[int] = []
    parallel: list[bool] = []
    for group in _parallel_groups(run):
        order += sorted(group, key=lambda i: run.nodes[i])
        parallel += [False] + [True] * (len(group) - 1)
    run.nodes = [run.nodes[i] for i in order]
    run.node_failed = [run.node_failed[i] for i in order]
    run.node_turn = [run.node_turn[i] for i in order]
    run.node_times = [run.node_times[i] for i in order]
    run.node_steps = [run.node_steps[i] for i in order]
    run.node_parallel = parallel


def is_subsequence(needle: list[str], hay: list[str]) -> bool:
    """True when ``needle`` appears in ``hay`` in order (other items may come between)."""
    it = iter(hay)
    return all(any(x == y for y in it) for x in needle)


def runs_table(runs: list[Run]) -> pa.Table:
    """One row per run: labels, the three trajectories, turns, intended-path outcomes."""
    rows = [_run_row(r) for r in runs]
    return pa.Table.from_pylist(rows, schema=_RUNS_SCHEMA)


def _run_row(r: Run) -> dict[str, Any]:
    completed = None if r.intended_path is None else is_subsequence(r.intended_path, r.nodes)
    return {
        "agent": r.agent, "agent_version": r.agent_version, "scenario": r.scenario,
        "variant_id": r.variant_id, "run_key": r.run_key, "replay_index": r.replay_index,
        "start_ns": r.start_ns, "turns": r.turns, "node_path": r.nodes, "action_path": r.actions,
        "action_input_path": r.action_inputs, "final_response": r.final_response,
        "intended_path": r.intended_path, "completed": completed,
        "converged": None if r.intended_path is None else r.nodes == r.intended_path,
    }


_L = pa.list_(pa.string())
_RUNS_SCHEMA = pa.schema(
    [
        ("agent", pa.string()), ("agent_version", pa.string()), ("scenario", pa.string()),
        ("variant_id", pa.string()), ("run_key", pa.string()), ("replay_index", pa.int64()),
        ("start_ns", pa.int64()), ("turns", pa.int64()), ("node_path", _L), ("action_path", _L),
        ("action_input_path", _L), ("final_response", pa.string()), ("intended_path", _L),
        ("completed", pa.bool_()), ("converged", pa.bool_()),
    ]
)


def transition_allowed(graph: AgentGraph, src: str, dst: str, crosses_turn: bool) -> bool:
    """True when the graph declares ``src -> dst``; across turns a terminal -> entry restart also counts."""
    if graph.allows(src, dst):
        return True
    return crosses_turn and src in graph.terminals and dst in graph.start


def _flag(flags: list[bool], i: int) -> bool:
    return flags[i] if i < len(flags) else False


def _visit_rows(r: Run, graph: AgentGraph | None) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for i, node in enumerate(r.nodes):
        has_next = i + 1 < len(r.nodes)
        nxt = r.nodes[i + 1] if has_next else None
        allowed = None
        parallel = has_next and _flag(r.node_parallel, i + 1)
        if graph is not None and nxt is not None and not parallel:
            allowed = transition_allowed(graph, node, nxt, r.node_turn[i + 1] != r.node_turn[i])
        rows.append({
            "agent": r.agent, "agent_version": r.agent_version, "run_key": r.run_key,
            "position": i, "turn": r.node_turn[i], "node": node, "failed": r.node_failed[i],
            "next_node": nxt, "next_failed": r.node_failed[i + 1] if has_next else None,
            "next_turn": r.node_turn[i + 1] if has_next else None, "allowed": allowed,
            "parallel": parallel,
        })
    return rows


def visits_table(runs: list[Run], graphs: Sequence[AgentGraph] = ()) -> pa.Table:
    """One row per node visit: agent, run, position, turn, node, failed, the next node, allowed
    (whether the agent's graph, see ``graph_for``, declares the transition; null without one) and
    parallel (the next visit is a parallel branch of this one: not a transition)."""
    rows = [row for r in runs for row in _visit_rows(r, graph_for(graphs, r.agent))]
    return pa.Table.from_pylist(rows, schema=_VISITS_SCHEMA)


_VISITS_SCHEMA = pa.schema(
    [
        ("agent", pa.string()), ("agent_version", pa.string()), ("run_key", pa.string()),
        ("position", pa.int64()), ("turn", pa.int64()), ("node", pa.string()), ("failed", pa.bool_()),
        ("next_node", pa.string()), ("next_failed", pa.bool_()), ("next_turn", pa.int64()),
        ("allowed", pa.bool_()),
        ("parallel", pa.bool_()),
    ]
)
