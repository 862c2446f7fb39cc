"""Reading what scoring needs from the views: pending builds, step facts, tool definitions, judge inputs.

These are stage-internal reads (like ``build`` reading spans), not analytical results, so the SQL
stays here. Every query works on the ``pending`` relation: the (trace_id, build_id) pairs of the
latest builds that are being scored in this pass.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import duckdb
import pyarrow as pa

from tracedag.pipeline.score.rubrics import JudgeInput
from tracedag.pipeline.score.rules import BASE_METRICS, DEFAULT_METRICS, StepFacts
from tracedag.pipeline.score.toolschema import is_definition_key, parse_definitions

# Latest builds (dag_nodes view) that have no rule rows yet: rules and evaluations score them.
PENDING_RULES_SQL = """
select distinct n.trace_id, n.build_id from dag_nodes n
where not exists (select 1 from step_scores_all s
                  where s.trace_id = n.trace_id and s.build_id = n.build_id and s.source = 'rule')
order by 1
"""

FACTS_CORE_SQL = """
select n.trace_id, n.span_id, n.topo_index, n.build_id, cast(n.step_type as varchar) as step_type, n.step_name,
       n.iteration, coalesce(s.status_code, n.status_code) as status_code, s.status_message, s.error_type,
       s.finish_reason, s.output_tokens, s.tool_name,
       -- full texts only where a rule reads them (tool results, tool arguments); llm outputs are
       -- only checked for emptiness, which their first 64 characters decide
       case when n.step_type = 'tool' then s.input_text end as input_text,
       coalesce(s.attributes['http.response.status_code'], s.attributes['http.status_code']) as http_status,
       coalesce(s.attributes['gen_ai.tool.call.arguments'], s.attributes['tool_call.function.arguments'])
           as tool_args,
       case when n.step_type = 'tool' then coalesce(s.output_text, s.attributes['gen_ai.tool.call.result'])
            else left(s.output_text, 64) end as result_text,
       s.attributes['gen_ai.task.status'] as task_status,
       [concat_ws(': ', e.attributes['exception.type'], e.attributes['exception.message'])
        for e in coalesce(s.events, []) if e.name = 'exception'] as exceptions
from dag_nodes n join pending p on p.trace_id = n.trace_id and p.build_id = n.build_id
left join spans s on s.trace_id = n.trace_id and s.span_id = n.span_id
"""

# A "quiet" step cannot make any rule fire: it is not a tool step, reports no failure (status,
# error.type, exception events, task status, HTTP status), has no finish reason a rule looks for,
# is not an LLM step with an empty-looking output (more than 4 ASCII letters/digits rule out every
# "empty" spelling) and is under the iteration bound. Each condition is at least as strict as the
# rule it stands for (tests/score/test_rules.py checks them against the rule table), so quiet
# steps get their passing rows straight from SQL and only the others go through Python.
QUIET_SQL = """(
    step_type is distinct from 'tool'
    and status_code is distinct from 2
    and coalesce(error_type, '') = ''
    and len(exceptions) = 0
    and coalesce(lower(task_status), '') <> 'failure'
    and http_status is null
    and (finish_reason is null or not regexp_matches(lower(finish_reason),
         'length|max_tokens|max_output_tokens|content_filter|safety|blocked|prohibited_content|error'))
    and (step_type is distinct from 'llm' or (coalesce(output_tokens, 1) <> 0 and
         (result_text is null or length(regexp_replace(result_text, '[^A-Za-z0-9]', '', 'g')) > 4)))
    and (cast($max_iterations as integer) is null or coalesce(iteration, 0) < cast($max_iterations as integer))
)"""

STEP_FACTS_SQL = f"""
select * from score_facts where not {QUIET_SQL}
"""

# The passing rows of the quiet steps: one per base metric of the step type (rules.BASE_METRICS).
QUIET_ROWS_SQL = f"""
select trace_id, span_id, build_id,
       unnest(coalesce(list_extract($metric_lists, list_position($types, step_type)), $default_metrics))
           as metric
from score_facts where {QUIET_SQL}
"""

DEFINITIONS_SQL = """
select s.trace_id, unnest(map_keys(s.attributes)) as k, unnest(map_values(s.attributes)) as v
from spans s semi join pending p on p.trace_id = s.trace_id
where len(list_filter(map_keys(s.attributes),
          lambda k: k in ('gen_ai.tool.definitions', 'tool.json_schema')
               or (k like 'llm.tools.%' and k like '%.tool.json_schema'))) > 0
"""

# Evaluations on a latest-build step that have no evaluation row for that build and metric yet
# (independent of the rule pass, so an evaluation arriving without a rebuild is still mapped).
EVALUATIONS_SQL = """
select e.trace_id, e.span_id, n.build_id, e.name, e.score_value, e.label, e.explanation, e.evaluator,
       e.source_kind, e.time_unix_nano
from evaluations e join dag_nodes n on n.trace_id = e.trace_id and n.span_id = e.span_id
where not exists (select 1 from step_scores_all s
                  where s.trace_id = e.trace_id and s.span_id = e.span_id and s.build_id = n.build_id
                    and s.source = 'evaluation' and s.metric = e.name)
"""

EVALUATIONS_OFF_DAG_SQL = """
select count(*) from evaluations e
where not exists (select 1 from dag_nodes n where n.trace_id = e.trace_id and n.span_id = e.span_id)
"""

# min and max of every metric's values over the whole table: the scale of the metric
EVALUATION_RANGES_SQL = """
select name, min(score_value), max(score_value) from evaluations
where name is not null and score_value is not null group by name
"""


def pending_rule_builds(con: duckdb.DuckDBPyConnection) -> pa.Table:
    """(trace_id, build_id) of the latest builds that have not been rule-scored."""
    return con.sql(PENDING_RULES_SQL).to_arrow_table()


def pending_steps(con: duckdb.DuckDBPyConnection, pending: pa.Table) -> int:
    """How many steps the ``pending`` builds have."""
    con.register("pending_all", pending)
    try:
        rows = con.execute("select count(*) from dag_nodes n semi join pending_all p "
                           "on p.trace_id = n.trace_id and p.build_id = n.build_id").fetchall()
    finally:
        con.unregister("pending_all")
    return int(rows[0][0])


def use_pending(con: duckdb.DuckDBPyConnection, pending: pa.Table) -> None:
    """Make ``pending`` the relation the other queries join on, and read its steps' facts once."""
    con.register("pending", pending)
    con.execute(f"create or replace temp table score_facts as {FACTS_CORE_SQL}")


def done_pending(con: duckdb.DuckDBPyConnection) -> None:
    """Drop what ``use_pending`` made."""
    con.execute("drop table if exists score_facts")
    con.unregister("pending")


def tool_definitions(con: duckdb.DuckDBPyConnection) -> dict[str, dict[str, dict[str, Any]]]:
    """``{trace_id: {tool name: parameters schema}}`` for the pending traces."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for trace_id, key, value in con.execute(DEFINITIONS_SQL).fetchall():
        if is_definition_key(key) and value:
            out.setdefault(trace_id, {}).update(parse_definitions(value))
    return out


def quiet_rows(con: duckdb.DuckDBPyConnection, max_iterations: int | None) -> pa.Table:
    """(trace_id, span_id, build_id, metric) of the passing rows of the pending quiet steps."""
    types = sorted(BASE_METRICS)
    params = {"max_iterations": max_iterations, "types": types, "metric_lists": [list(BASE_METRICS[t]) for t in types],
              "default_metrics": list(DEFAULT_METRICS)}
    return con.sql(QUIET_ROWS_SQL, params=params).to_arrow_table()


def step_facts(con: duckdb.DuckDBPyConnection, defs: dict[str, dict[str, dict[str, Any]]],
               max_iterations: int | None, batch_rows: int = 50_000) -> Iterator[list[StepFacts]]:
    """Yield the pending steps that are not quiet as ``StepFacts``, ``batch_rows`` at a time."""
    reader = con.sql(STEP_FACTS_SQL, params={"max_iterations": max_iterations}).to_arrow_reader(batch_rows)
    for batch in reader:
        yield [_facts(r, defs, max_iterations) for r in batch.to_pylist()]


def _facts(r: dict[str, Any], defs: dict[str, dict[str, dict[str, Any]]], max_iterations: int | None) -> StepFacts:
    tool = r["tool_name"] or (r["step_name"] if r["step_type"] == "tool" else None)
    schema = defs.get(r["trace_id"], {}).get(tool) if tool else None
    return StepFacts(
        trace_id=r["trace_id"], span_id=r["span_id"], build_id=r["build_id"], step_type=r["step_type"],
        step_name=r["step_name"], tool_name=tool, iteration=r["iteration"], status_code=r["status_code"],
        status_message=r["status_message"], error_type=r["error_type"], finish_reason=r["finish_reason"],
        output_text=r["result_text"], input_text=r["input_text"], output_tokens=r["output_tokens"],
        http_status=r["http_status"], tool_args=r["tool_args"], task_status=r["task_status"],
        exceptions=[e for e in (r["exceptions"] or []) if e], tool_schema=schema, max_iterations=max_iterations,
    )


def evaluation_rows(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """The ``evaluations`` rows on latest-build steps not mapped yet, each with the step's build_id."""
    rows: list[dict[str, Any]] = con.sql(EVALUATIONS_SQL).to_arrow_table().to_pylist()
    return rows


def evaluations_off_dag(con: duckdb.DuckDBPyConnection) -> int:
    """How many evaluations target no built step (no span id, or a span not built yet)."""
    return int(con.execute(EVALUATIONS_OFF_DAG_SQL).fetchall()[0][0])


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
