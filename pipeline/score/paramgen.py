"""Arguments the model made up: the LLM step that emitted a rejected tool call fails too (PARAMGEN).

A tool step whose ``arguments`` row fails (the arguments are not JSON, break the tool's schema, or
the tool rejected them: ``rules.RULES`` ``tool_args_*``) ran a call whose arguments an LLM step
wrote. The build links the two with a ``tool_call`` edge (``dag.toolcalls``: by the call id the
dialect records, else by time). That LLM step gets a failing ``arguments`` row of its own, rule
``emitted_invalid_arguments``, taxonomy ``generation / output_form / invalid_tool_arguments``
(AgentEval's parameter-generation failure), with the lowest score among its rejected calls; it is
upstream of the tool step, so propagation makes it the root cause and the tool step its effect.

Derived from the rule rows of a chunk of builds and the edges of those builds: the columnar pass
and the per-step reference call it on the rows they made (one query, only when a chunk has a
failing ``arguments`` row on a tool step).
"""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from tracedag.pipeline.score.rows import FAILED_AT, ScoreRow, categorize, to_table
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


def upstream_rows(con: duckdb.DuckDBPyConnection, pending: pa.Table, rows: pa.Table) -> list[ScoreRow]:
    """The ``emitted_invalid_arguments`` rows of the LLM steps behind the failing tool calls in ``rows``.

    ``pending``: the (trace_id, build_id) of the builds ``rows`` scored; ``rows``: their rule rows.
    """
    bad = failing_arguments(rows).select(["trace_id", "span_id", "build_id", "score", "explanation"])
    if bad.num_rows == 0:
        return []
    con.register("paramgen_bad", bad)
    con.register("paramgen_pending", pending.select(["trace_id", "build_id"]))
    try:
        found = con.execute(_SQL).fetchall()
    finally:
        con.unregister("paramgen_bad")
        con.unregister("paramgen_pending")
    return [_row(*r) for r in found]


def _row(trace_id: str, span_id: str, build_id: str, score: float, calls: int, detail: str) -> ScoreRow:
    more = f" (and {calls - 1} more call{'s' if calls > 2 else ''})" if calls > 1 else ""
    category, _ = categorize(float(score), CATEGORY, "")
    return ScoreRow(trace_id, span_id, build_id, METRIC, float(score), "rule", rule_name=RULE,
                    explanation=f"{EXPLAIN}: {detail}{more}"[:600], category=category)


def upstream_table(con: duckdb.DuckDBPyConnection, pending: pa.Table, rows: pa.Table) -> pa.Table:
    """``upstream_rows`` as ``STEP_SCORES_V1`` rows."""
    found = upstream_rows(con, pending, rows)
    return to_table(found) if found else STEP_SCORES_V1.empty_table()
