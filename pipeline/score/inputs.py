"""Reading what scoring needs from the views: pending builds, step facts, tool definitions, judge inputs.

These are stage-internal reads (like ``build`` reading spans), not analytical results, so the SQL
stays here. The step queries work on the ``pending`` relation: the (trace_id, build_id) pairs of
the latest builds that are being scored in this pass (``scan`` reads them for ``score_store``,
``use_pending`` and ``tool_definitions`` for the per-step reference).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from tracedag.pipeline.score.judge.rubrics import JudgeInput
from tracedag.pipeline.score.rules.table import StepFacts
from tracedag.pipeline.score.rules.toolschema import EmittedCall, Entries, emitted_calls, span_definitions
from tracedag.pipeline.store.fetch import arrow

# The latest build of each trace, as the traces view picks it, read from two columns of
# traces_all (the view packs whole rows): the queries below join dag_nodes_all with it instead
# of reading the dag_nodes view, at a fraction of the cost when little is new.
LATEST_BUILDS_SQL = """
select trace_id, arg_max(build_id, (built_unix_nano, build_id)) as build_id from traces_all group by trace_id
"""

LATEST_NODES_SQL = f"""
latest as ({LATEST_BUILDS_SQL}),
latest_nodes as (
    select n.* from dag_nodes_all n semi join latest l on l.trace_id = n.trace_id and l.build_id = n.build_id
)"""

# Latest builds that have no rule rows yet, with their step counts: rules and evaluations score them.
PENDING_RULES_SQL = f"""
with latest as ({LATEST_BUILDS_SQL}), todo as (
    select t.trace_id, t.build_id from latest t
    anti join step_scores_all s on s.trace_id = t.trace_id and s.build_id = t.build_id and s.source = 'rule'
)
select n.trace_id, n.build_id, count(*) as steps
from dag_nodes_all n semi join todo t on t.trace_id = n.trace_id and t.build_id = n.build_id
group by all order by 1
"""

# What the rules read of one step: its dag_nodes row (n) and its span (s), with {input_text} the
# expression of its input text (``facts_columns``).
_FACTS_COLUMNS = """
       n.trace_id, n.span_id, n.topo_index, n.build_id, cast(n.step_type as varchar) as step_type, n.step_name,
       n.iteration, coalesce(s.status_code, n.status_code) as status_code, s.status_message, s.error_type,
       s.finish_reason, s.output_tokens, s.tool_name,
       -- full texts only where a rule reads them (tool results, tool arguments); llm outputs are
       -- only checked for emptiness, which their first 64 characters decide
       {input_text} as input_text,
       coalesce(s.attributes['http.response.status_code'], s.attributes['http.status_code']) as http_status,
       coalesce(s.attributes['gen_ai.tool.call.arguments'], s.attributes['tool_call.function.arguments'])
           as tool_args,
       case when n.step_type = 'tool' then coalesce(s.output_text, s.attributes['gen_ai.tool.call.result'])
            else left(s.output_text, 64) end as result_text,
       s.attributes['gen_ai.task.status'] as task_status,
       [concat_ws(': ', e.attributes['exception.type'], e.attributes['exception.message'])
        for e in coalesce(s.events, []) if e.name = 'exception'] as exceptions
"""

TOOL_INPUT_TEXT = "case when n.step_type = 'tool' then s.input_text end"


def facts_columns(input_text: str = TOOL_INPUT_TEXT) -> str:
    """The select list of a step's facts, ``input_text`` the SQL of its input text."""
    return _FACTS_COLUMNS.format(input_text=input_text)


FACTS_COLUMNS = facts_columns()

FACTS_CORE_SQL = f"""
select {FACTS_COLUMNS}
from dag_nodes n join pending p on p.trace_id = n.trace_id and p.build_id = n.build_id
left join spans s on s.trace_id = n.trace_id and s.span_id = n.span_id
"""

# A "calm" step reports no failure (status, error.type, exception events, task status, HTTP
# status), has no finish reason a rule looks for and is under the iteration bound.
CALM_SQL = """
    status_code is distinct from 2
    and coalesce(error_type, '') = ''
    and len(exceptions) = 0
    and coalesce(lower(task_status), '') <> 'failure'
    and http_status is null
    and (finish_reason is null or not regexp_matches(lower(finish_reason),
         'length|max_tokens|max_output_tokens|content_filter|safety|blocked|prohibited_content|error'))
    and (cast($max_iterations as integer) is null or coalesce(iteration, 0) < cast($max_iterations as integer))
"""

# A "quiet" step cannot make any rule fire: it is calm, not a tool step, and not an LLM step with
# an empty-looking output (5 ASCII letters/digits or more rule out every "empty" spelling).
# Each condition is at least as strict as the rule it stands for (tests/score/test_rules.py
# checks them against the rule table), so quiet steps get their passing rows without Python.
# (case, unlike and/or, evaluates a branch only on the rows that reach it: as a column, the
# output check then runs on LLM outputs only.)
def quiet_sql(calm: str = CALM_SQL) -> str:
    """``QUIET_SQL`` with ``calm`` the SQL of the calm condition (a column that holds it, say)."""
    return f"""(case when step_type is distinct from 'tool' and {calm} then
    case when step_type = 'llm' then coalesce(output_tokens, 1) <> 0 and
         (result_text is null or regexp_matches(result_text, '[A-Za-z0-9](?:[^A-Za-z0-9]*[A-Za-z0-9]){{4}}'))
    else true end
else false end)"""


QUIET_SQL = quiet_sql()

# A span's attribute entries that may hold tool definitions (``rules.toolschema.span_definitions`` decides):
# the definitions given to the model, and a tool span's own parameters schema with its tool's name and description.
DEFINITION_ENTRIES_SQL = """[e for e in map_entries(s.attributes)
    if e.key in ('gen_ai.tool.definitions', 'tool.json_schema', 'tool.parameters', 'gen_ai.tool.json_schema')
       or (e.key like 'llm.tools.%' and e.key like '%.tool.json_schema')
       or (e.key in ('tool.name', 'gen_ai.tool.name', 'tool.description', 'gen_ai.tool.description')
           and (s.attributes['tool.parameters'] is not null or s.attributes['gen_ai.tool.json_schema'] is not null))]"""

# A span's attribute entries that may hold the tool calls of its output (``rules.toolschema.emitted_calls``).
CALL_ENTRIES_SQL = """[e for e in map_entries(s.attributes)
    if (e.key like 'llm.output_messages.%' and e.key like '%.tool_calls.%')
       or (e.key like 'gen_ai.completion.%' and e.key like '%.tool_calls.%')
       or (e.key = 'gen_ai.output.messages' and contains(e.value, '"tool_call"'))]"""

DEFINITIONS_SQL = f"""
select trace_id, entries from (
    select s.trace_id, {DEFINITION_ENTRIES_SQL} as entries
    from spans s semi join pending p on p.trace_id = s.trace_id
) where len(entries) > 0
"""

# The tool calls in the output of the pending LLM steps (the reference's read; ``scan`` reads them in its pass).
CALLS_SQL = f"""
select trace_id, span_id, entries from (
    select n.trace_id, n.span_id, {CALL_ENTRIES_SQL} as entries
    from dag_nodes n join pending p on p.trace_id = n.trace_id and p.build_id = n.build_id
    join spans s on s.trace_id = n.trace_id and s.span_id = n.span_id
    where n.step_type = 'llm'
) where len(entries) > 0
"""

# Evaluations without an evaluation row for their metric on their step's latest build: those on
# a latest-build step (build_id set) get mapped, the others target no built step. (Independent
# of the rule pass, so an evaluation arriving without a rebuild is still mapped.) An evaluation
# row is only ever written for a step of the build it names, so every evaluation off the DAG is
# among these: one join with the steps serves both.
EVALUATIONS_SQL = f"""
with {LATEST_NODES_SQL},
done as (
    select s.trace_id, s.span_id, s.metric from step_scores_all s
    semi join latest l on l.trace_id = s.trace_id and l.build_id = s.build_id
    where s.source = 'evaluation'
), todo as (
    select e.* from evaluations e
    anti join done d on d.trace_id = e.trace_id and d.span_id = e.span_id and d.metric = e.name
)
select e.trace_id, e.span_id, n.build_id, e.name, e.score_value, e.label, e.explanation, e.evaluator,
       e.source_kind, e.time_unix_nano, n.span_id is not null as on_dag
from todo e left join latest_nodes n on n.trace_id = e.trace_id and n.span_id = e.span_id
"""

# min and max of every metric's values over the whole table: the scale of the metric
EVALUATION_RANGES_SQL = """
select name, min(score_value), max(score_value) from evaluations
where name is not null and score_value is not null group by name
"""


# The same, among the builds made since ``$since`` (ns): the traces_all, step_scores_all and
# dag_nodes_all files of older builds are skipped on their statistics (build ids sort by time).
# A trace built since then has its latest build among them.
PENDING_RULES_SINCE_SQL = """
with latest as (
    select trace_id, arg_max(build_id, (built_unix_nano, build_id)) as build_id from traces_all
    where built_unix_nano >= $since group by trace_id
), todo as (
    select t.trace_id, t.build_id from latest t
    anti join (select trace_id, build_id from step_scores_all where source = 'rule' and build_id >= $since_id) s
        on s.trace_id = t.trace_id and s.build_id = t.build_id
)
select n.trace_id, n.build_id, count(*) as steps
from dag_nodes_all n semi join todo t on t.trace_id = n.trace_id and t.build_id = n.build_id
where n.build_id >= $since_id
group by all order by 1
"""


def pending_rule_builds(con: duckdb.DuckDBPyConnection, since_ns: int = 0) -> pa.Table:
    """(trace_id, build_id, steps) of the latest builds that have not been rule-scored
    (only among the builds made since ``since_ns`` when it is set)."""
    if since_ns <= 0:
        return arrow(con, PENDING_RULES_SQL)
    params = {"since": since_ns, "since_id": f"build-{since_ns:020d}"}
    return arrow(con, PENDING_RULES_SINCE_SQL, params)


def use_pending(con: duckdb.DuckDBPyConnection, pending: pa.Table) -> None:
    """Make ``pending`` the relation the other queries join on, and read its steps' facts once."""
    con.register("pending", pending)
    con.execute(f"create or replace temp table score_facts as {FACTS_CORE_SQL}")


def done_pending(con: duckdb.DuckDBPyConnection) -> None:
    """Drop what ``use_pending`` made."""
    con.execute("drop table if exists score_facts")
    con.unregister("pending")


Definitions = dict[str, dict[str, dict[str, Any]]]
"""``{trace_id: {tool name: parameters schema}}``."""

Calls = dict[tuple[str, str], list[EmittedCall]]
"""``{(trace_id, span_id): the tool calls in that LLM step's output}``."""


def tool_definitions(con: duckdb.DuckDBPyConnection) -> Definitions:
    """The tool definitions of the pending traces."""
    return definitions_from((t, _pairs(e)) for t, e in con.execute(DEFINITIONS_SQL).fetchall())


def emitted_tool_calls(con: duckdb.DuckDBPyConnection, defs: Definitions) -> Calls:
    """The tool calls in the output of the pending LLM steps of the traces that define tools."""
    return calls_from((t, s, _pairs(e)) for t, s, e in con.execute(CALLS_SQL).fetchall() if t in defs)


def _pairs(entries: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    return [(str(e["key"]), e["value"]) for e in entries]


def definitions_from(spans: Iterable[tuple[str, Entries]]) -> Definitions:
    """Definitions from each span's (trace_id, attribute entries), later spans winning; a tool
    span's own parameters schema only for a tool no definition given to the model names."""
    given: Definitions = {}
    bare: Definitions = {}
    for trace_id, entries in spans:
        mine, own = span_definitions(entries)
        if mine:
            given.setdefault(trace_id, {}).update(mine)
        if own:
            bare.setdefault(trace_id, {}).update(own)
    for trace_id, tools in bare.items():
        named = given.setdefault(trace_id, {})
        for name, schema in tools.items():
            named.setdefault(name, schema)
    return given


def calls_from(steps: Iterable[tuple[str, str, Entries]]) -> Calls:
    """The emitted calls of each (trace_id, span_id, attribute entries) that has any."""
    out: Calls = {}
    for trace_id, span_id, entries in steps:
        calls = emitted_calls(entries)
        if calls:
            out[(trace_id, span_id)] = calls
    return out


def step_tool(tool_name: str | None, step_name: str | None, step_type: str | None) -> str | None:
    """The tool a step calls: its ``tool_name``, else a tool step's ``step_name``."""
    return tool_name or (step_name if step_type == "tool" else None)


def tool_schema(defs: Definitions, trace_id: str, tool: str | None) -> dict[str, Any] | None:
    """The parameters schema of ``tool`` defined in the trace, if any."""
    return defs.get(trace_id, {}).get(tool) if tool else None


def facts_from_row(r: dict[str, Any], defs: Definitions, max_iterations: int | None) -> StepFacts:
    """The ``StepFacts`` of one row of ``FACTS_COLUMNS``, with its tool's schema from ``defs``."""
    tool = step_tool(r["tool_name"], r["step_name"], r["step_type"])
    schema = tool_schema(defs, r["trace_id"], tool)
    return StepFacts(
        trace_id=r["trace_id"], span_id=r["span_id"], build_id=r["build_id"], step_type=r["step_type"],
        step_name=r["step_name"], tool_name=tool, iteration=r["iteration"], status_code=r["status_code"],
        status_message=r["status_message"], error_type=r["error_type"], finish_reason=r["finish_reason"],
        output_text=r["result_text"], input_text=r["input_text"], output_tokens=r["output_tokens"],
        http_status=r["http_status"], tool_args=r["tool_args"], task_status=r["task_status"],
        exceptions=[e for e in (r["exceptions"] or []) if e], tool_schema=schema, max_iterations=max_iterations,
    )


_facts = facts_from_row  # the name tests/score/test_rules.py knows


def evaluation_rows(con: duckdb.DuckDBPyConnection) -> tuple[list[dict[str, Any]], int]:
    """The ``evaluations`` rows on latest-build steps not mapped yet (each with the step's build_id),
    and how many evaluations target no built step (no span id, or a span not built yet)."""
    table = arrow(con, EVALUATIONS_SQL)
    on_dag = pc.fill_null(table.column("on_dag"), False)
    rows: list[dict[str, Any]] = table.filter(on_dag).drop_columns(["on_dag"]).to_pylist()
    return rows, table.num_rows - len(rows)


def evaluation_ranges(con: duckdb.DuckDBPyConnection) -> dict[str, tuple[float, float]]:
    """(min, max) of each evaluation metric's values over the whole table."""
    return {name: (lo, hi) for name, lo, hi in con.execute(EVALUATION_RANGES_SQL).fetchall()}


# ---- judge ----------------------------------------------------------------------------------------

# Latest-build steps with a rubric metric not judged on that build yet (at most $limit steps),
# with the outputs of their upstream steps (never their scores).
JUDGE_CANDIDATES_SQL = """
with rubric as (
    select unnest($types) as step_type, unnest($metrics) as metric
), todo as (
    select n.trace_id, n.span_id, n.build_id, list(r.metric order by r.metric) as todo,
           min(n.topo_index) as topo_index
    from dag_nodes n join rubric r on r.step_type = cast(n.step_type as varchar)
    where not exists (select 1 from step_scores_all s
                      where s.source = 'judge' and s.trace_id = n.trace_id and s.span_id = n.span_id
                        and s.build_id = n.build_id and s.metric = r.metric)
    group by n.trace_id, n.span_id, n.build_id
    order by n.trace_id, topo_index
    limit $limit
), upstream as (
    select e.trace_id, e.downstream_span_id as span_id,
           list(struct_pack(label := concat_ws(' ', cast(u.step_type as varchar),
                                               coalesce(u.step_name, cast(u.name as varchar))),
                            text := u.output_text) order by u.end_time_unix_nano desc) as ups
    from dag_edges e
    join todo t on t.trace_id = e.trace_id and t.span_id = e.downstream_span_id
    join spans u on u.trace_id = e.trace_id and u.span_id = e.upstream_span_id
    group by all
)
select t.trace_id, t.span_id, t.build_id, cast(n.step_type as varchar) as step_type,
       coalesce(n.step_name, cast(s.name as varchar)) as step_name, s.tool_name, s.model,
       coalesce(s.status_code, n.status_code) as status_code, s.status_message, s.input_text, s.output_text,
       t.todo, coalesce(up.ups, []) as upstream
from todo t
join dag_nodes n on n.trace_id = t.trace_id and n.span_id = t.span_id and n.build_id = t.build_id
left join spans s on s.trace_id = t.trace_id and s.span_id = t.span_id
left join upstream up on up.trace_id = t.trace_id and up.span_id = t.span_id
order by t.trace_id, t.topo_index
"""

_STATUS = {0: "unset", 1: "ok", 2: "error"}


def _clip(text: str | None, limit: int) -> str:
    if not text:
        return ""
    return text if len(text) <= limit else text[:limit] + f" ... [{len(text) - limit} more characters]"


def judge_input(r: dict[str, Any], max_chars: int, max_upstream: int) -> JudgeInput:
    """What the judge sees of one candidate row: no upstream scores, only upstream outputs."""
    status = _STATUS.get(r["status_code"] or 0, "unset")
    if r["status_message"]:
        status += f" ({_clip(r['status_message'], 300)})"
    ups = tuple((u["label"] or "step", _clip(u["text"], max_chars // 4) or "(no output recorded)")
                for u in (r["upstream"] or [])[:max_upstream])
    return JudgeInput(step_type=r["step_type"], step_name=r["step_name"] or "", tool_name=r["tool_name"],
                      status=status, input_text=_clip(r["input_text"], max_chars),
                      output_text=_clip(r["output_text"], max_chars), upstream=ups)


def judge_candidates(con: duckdb.DuckDBPyConnection, rubric_keys: list[tuple[str, str]],
                     limit: int | None) -> list[dict[str, Any]]:
    """Latest-build steps with (step type, metric) rubrics not judged yet, with ``todo`` metrics."""
    params = {"types": [t for t, _ in rubric_keys], "metrics": [m for _, m in rubric_keys], "limit": limit}
    rows: list[dict[str, Any]] = con.sql(JUDGE_CANDIDATES_SQL, params=params).to_arrow_table().to_pylist()
    return rows
