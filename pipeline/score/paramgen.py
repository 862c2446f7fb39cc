"""Arguments the model made up: the LLM step that emitted a rejected tool call fails too (PARAMGEN).

A tool step whose ``arguments`` row fails (the arguments are not JSON, break the tool's schema, or
the tool rejected them: ``rules.table.RULES`` ``tool_args_*``) ran a call whose arguments an LLM step
wrote. The build links the two with a ``tool_call`` edge (``dag.toolcalls``: by the call id the
dialect records, else by time). That LLM step gets a failing ``arguments`` row of its own, rule
``emitted_invalid_arguments``, taxonomy ``generation / output_form / invalid_tool_arguments``
(AgentEval's parameter-generation failure), with the lowest score among its rejected calls; it is
upstream of the tool step, so propagation makes it the root cause and the tool step its effect.

A call no tool step ran (the framework rejected it before running the tool: smolagents checks a
call's arguments against the tool's inputs first) is checked where it was written: each tool call
in an LLM step's output (``rules.toolschema.emitted_calls``) whose tool is defined in the trace and that
no tool step linked to that LLM step by a ``tool_call`` edge ran (same tool name) is validated
against the tool's schema; arguments that are not JSON score 1, that break the schema 2, unless a
later LLM step of the trace emitted a call of the same tool that fits (the model corrected the call:
nothing failed). Such a failure has no failed tool behind it, so a later iteration of the model step
does not recover it (``queries/_failure_graph.sql``, ``unredone``). One row per LLM step: the
lowest score of both ways.

Derived from the rule rows of a chunk of builds, the emitted calls and definitions of their traces
and the edges of those builds: the columnar pass and the per-step reference call it on the rows
they made (one query when a chunk has a failing ``arguments`` row on a tool step, one when an LLM
step emitted a call that breaks its tool's schema).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from tracedag.pipeline.score.inputs import Calls, Definitions
from tracedag.pipeline.score.rows import FAILED_AT, ScoreRow, categorize, to_table
from tracedag.pipeline.score.rules.toolschema import ArgsProblem, EmittedCall, call_problem
from tracedag.schemas.tables import STEP_SCORES_V1

RULE = "emitted_invalid_arguments"
METRIC = "arguments"
CATEGORY = "invalid_tool_arguments"
EXPLAIN = "the tool call it emitted had invalid arguments"

_SQL = """
select e.trace_id, e.upstream_span_id as span_id, e.build_id, min(b.score) as score, count(*) as calls,
       arg_min(concat_ws(': ', coalesce(n.step_name, e.downstream_span_id), b.explanation),
               (b.score, e.downstream_span_id)) as detail
from dag_edges_all e
semi join paramgen_pending p on p.trace_id = e.trace_id and p.build_id = e.build_id
join paramgen_bad b on b.trace_id = e.trace_id and b.span_id = e.downstream_span_id and b.build_id = e.build_id
left join dag_nodes_all n on n.trace_id = e.trace_id and n.build_id = e.build_id and n.span_id = e.downstream_span_id
where e.edge_kind = 'tool_call'
group by all
order by e.trace_id, e.upstream_span_id
"""


def failing_arguments(rows: pa.Table) -> pa.Table:
    """The rule rows of ``rows`` that fail on ``arguments`` (only tool steps have such rows)."""
    keep = pc.and_(pc.equal(rows.column("metric"), METRIC), pc.less_equal(rows.column("score"), FAILED_AT))
    return rows.filter(pc.and_(keep, pc.not_equal(rows.column("rule_name"), RULE)))


def upstream_rows(con: duckdb.DuckDBPyConnection, pending: pa.Table, rows: pa.Table,
                  calls: Calls | None = None, defs: Definitions | None = None) -> list[ScoreRow]:
    """The ``emitted_invalid_arguments`` rows of the LLM steps behind the failing tool calls in ``rows``
    and of those that emitted a call no tool step ran whose arguments break the tool's schema.

    ``pending``: the (trace_id, build_id) of the builds ``rows`` scored; ``rows``: their rule rows;
    ``calls`` and ``defs``: the emitted tool calls and tool definitions of their traces.
    """
    found = _behind_tools(con, pending, rows) + unran_rows(con, pending, calls or {}, defs or {})
    return _one_per_step(found)


def _behind_tools(con: duckdb.DuckDBPyConnection, pending: pa.Table, rows: pa.Table) -> list[ScoreRow]:
    bad = failing_arguments(rows).select(["trace_id", "span_id", "build_id", "score", "explanation"])
    if bad.num_rows == 0:
        return []
    found = _fetch(con, _SQL, {"paramgen_bad": bad, "paramgen_pending": pending.select(["trace_id", "build_id"])})
    return [_row(*r) for r in found]


def _fetch(con: duckdb.DuckDBPyConnection, sql: str, tables: dict[str, pa.Table]) -> list[tuple[Any, ...]]:
    """``sql``'s rows, with ``tables`` registered under their names for that query only."""
    for name, table in tables.items():
        con.register(name, table)
    try:
        return con.execute(sql).fetchall()
    finally:
        for name in tables:
            con.unregister(name)


def _row(trace_id: str, span_id: str, build_id: str, score: float, calls: int, detail: str) -> ScoreRow:
    more = f" (and {calls - 1} more call{'s' if calls > 2 else ''})" if calls > 1 else ""
    category, _ = categorize(float(score), CATEGORY, "")
    return ScoreRow(trace_id, span_id, build_id, METRIC, float(score), "rule", rule_name=RULE,
                    explanation=f"{EXPLAIN}: {detail}{more}"[:600], category=category)


def _one_per_step(rows: list[ScoreRow]) -> list[ScoreRow]:
    """One row per (trace, span, build): the lowest score (the first of equal ones)."""
    best: dict[tuple[str, str, str | None], ScoreRow] = {}
    for r in rows:
        key = (r.trace_id, r.span_id, r.build_id)
        if key not in best or r.score < best[key].score:
            best[key] = r
    return list(best.values())


# The LLM steps of the pending builds among ``paramgen_llm``: start and the tool steps their tool_call edges reach.
_LLM_SQL = """
select n.trace_id, n.span_id, n.build_id, n.start_time_unix_nano,
       list(t.step_name) filter (where t.step_name is not null) as ran
from dag_nodes_all n
semi join paramgen_pending p on p.trace_id = n.trace_id and p.build_id = n.build_id
semi join paramgen_llm l on l.trace_id = n.trace_id and l.span_id = n.span_id
left join dag_edges_all e on e.trace_id = n.trace_id and e.build_id = n.build_id
     and e.upstream_span_id = n.span_id and e.edge_kind = 'tool_call'
left join dag_nodes_all t on t.trace_id = e.trace_id and t.build_id = e.build_id and t.span_id = e.downstream_span_id
group by all
"""


@dataclass(frozen=True)
class _Llm:
    build_id: str
    start: int
    ran: frozenset[str]


def unran_rows(con: duckdb.DuckDBPyConnection, pending: pa.Table, calls: Calls, defs: Definitions) -> list[ScoreRow]:
    """The rows of the LLM steps that emitted a call no tool step ran, whose arguments break the
    tool's schema and that no later LLM step of the trace redid with arguments that fit."""
    bad = {key: found for key, found in ((k, _bad_calls(k[0], c, defs)) for k, c in calls.items()) if found}
    if not bad:
        return []
    traces = {t for t, _ in bad}
    steps = _llm_steps(con, pending, {(t, s) for t, s in calls if t in traces})
    out: list[ScoreRow] = []
    for (trace_id, span_id), problems in bad.items():
        me = steps.get((trace_id, span_id))
        if me is None:
            continue
        left = [(c, p) for c, p in problems if c.name not in me.ran
                and not _redone(c, trace_id, me.start, calls, steps, defs)]
        if left:
            out.append(_unran_row(trace_id, span_id, me.build_id, left))
    return out


def _bad_calls(trace_id: str, calls: list[EmittedCall], defs: Definitions) -> list[tuple[EmittedCall, ArgsProblem]]:
    tools = defs.get(trace_id, {})
    found = [(c, call_problem(c, tools[c.name])) for c in calls if c.name in tools]
    return [(c, p) for c, p in found if p is not None]


def _llm_steps(con: duckdb.DuckDBPyConnection, pending: pa.Table, keys: set[tuple[str, str]]) -> dict[tuple[str, str], _Llm]:
    wanted = pa.table({"trace_id": [t for t, _ in keys], "span_id": [s for _, s in keys]},
                      schema=pa.schema([("trace_id", pa.string()), ("span_id", pa.string())]))
    found = _fetch(con, _LLM_SQL, {"paramgen_llm": wanted, "paramgen_pending": pending.select(["trace_id", "build_id"])})
    return {(t, s): _Llm(b, int(start or 0), frozenset(ran or [])) for t, s, b, start, ran in found}


def _redone(call: EmittedCall, trace_id: str, start: int, calls: Calls, steps: dict[tuple[str, str], _Llm],
            defs: Definitions) -> bool:
    """A later LLM step of the trace emitted a call of the same tool whose arguments fit its schema."""
    schema = defs[trace_id][call.name]
    for key, theirs in calls.items():
        later = steps.get(key)
        if key[0] != trace_id or later is None or later.start <= start:
            continue
        if any(c.name == call.name and call_problem(c, schema) is None for c in theirs):
            return True
    return False


def _unran_row(trace_id: str, span_id: str, build_id: str, bad: list[tuple[EmittedCall, ArgsProblem]]) -> ScoreRow:
    score = min(_SCORES[p.kind] for _, p in bad)
    call, problem = next((c, p) for c, p in bad if _SCORES[p.kind] == score)
    more = f" (and {len(bad) - 1} more call{'s' if len(bad) > 2 else ''})" if len(bad) > 1 else ""
    detail = f"{call.name}: {problem.detail}; the call never ran{more}"
    category, _ = categorize(score, CATEGORY, "")
    return ScoreRow(trace_id, span_id, build_id, METRIC, score, "rule", rule_name=RULE,
                    explanation=f"{EXPLAIN}: {detail}"[:600], category=category)


# as the tool steps' rules score the same problems (rules.RULES tool_args_*)
_SCORES = {"not_json": 1.0, "unknown_field": 2.0, "schema": 2.0}


def upstream_table(con: duckdb.DuckDBPyConnection, pending: pa.Table, rows: pa.Table,
                   calls: Calls | None = None, defs: Definitions | None = None) -> pa.Table:
    """``upstream_rows`` as ``STEP_SCORES_V1`` rows."""
    found = upstream_rows(con, pending, rows, calls, defs)
    return to_table(found) if found else STEP_SCORES_V1.empty_table()
