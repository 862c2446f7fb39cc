"""One read of everything the rules need for a chunk of pending builds.

``read_scan(con, pending, max_iterations)`` joins the pending steps with the spans of their
traces once: the step facts (``inputs.FACTS_COLUMNS``, without texts no rule reads) with
three flags computed in SQL, and the tool definitions of every span of those traces (spans not
in the DAG too, as ``inputs.DEFINITIONS_SQL`` reads them). Reading the definitions in the same
pass spares a second scan of the ``attributes`` column, the largest one.

- ``quiet``: ``inputs.QUIET_SQL`` (calm, not a tool step, no empty-looking LLM output), a step no
  rule can fire on;
- ``tool_calm``: a calm tool step (``inputs.CALM_SQL``): only its result, its arguments and its
  tool's schema can make a rule fire, which ``columnar`` decides;
- ``tool_quiet``: a calm tool step whose result can neither report an error nor be empty: no
  result, or an object (first character ``{``, not ``{}``) without any key
  ``rules.RESULT_KEY_HINTS`` names (``columnar`` asks the rules about the other results).
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracedag.pipeline.score.inputs import (
    CALM_SQL,
    Definitions,
    definitions_from,
    facts_columns,
    quiet_sql,
    step_tool,
    tool_schema,
)
from tracedag.pipeline.score.rules import RESULT_KEY_HINTS

_NO_RESULT_HINT = " and ".join(f"not contains(result_text, '{h}')" for h in RESULT_KEY_HINTS)

# The flags, over the facts and a ``calm`` column (``inputs.CALM_SQL``, computed once).
FLAGS_SQL = f"""
    {quiet_sql("calm")} as quiet,
    (case when step_type = 'tool' and calm then true else false end) as tool_calm,
    (case when step_type = 'tool' and calm then
        result_text is null or (starts_with(result_text, '{{') and not starts_with(result_text, '{{}}')
                                and {_NO_RESULT_HINT})
     else false end) as tool_quiet
"""

# The result of a tool_quiet step is left out: the step is calm, so its result only counts
# through rules.tool_result_reports_error and rules.tool_output_empty, which are False for such
# a result and for none alike. Input texts are left out too: ``with_input_texts`` reads the
# few that a rule reads. Together, over half of the bytes.
_SCAN_COLUMNS = facts_columns("cast(null as varchar)")

# Attribute entries that may hold tool definitions (toolschema.is_definition_key decides).
_DEFINITION_ENTRIES = """[e for e in map_entries(s.attributes)
    if e.key in ('gen_ai.tool.definitions', 'tool.json_schema')
       or (e.key like 'llm.tools.%' and e.key like '%.tool.json_schema')]"""

SCAN_SQL = f"""
with nodes as (  -- pending holds latest builds: their nodes, without the dag_nodes view's own pick
    select n.* from dag_nodes_all n semi join pending p on p.trace_id = n.trace_id and p.build_id = n.build_id
), traced as (  -- no rule reads conversation_id: the raw spans, from the earliest arrival that can matter
    select s.* from spans_all s semi join pending p on p.trace_id = s.trace_id
    where s.received_unix_nano >= $received_from
), facts as (
    select {_SCAN_COLUMNS}, s.trace_id as span_trace_id, {_DEFINITION_ENTRIES} as definitions
    from nodes n full join traced s on s.trace_id = n.trace_id and s.span_id = n.span_id
), calmed as (
    select *, {CALM_SQL} as calm from facts
), flagged as (
    select * exclude (calm), {FLAGS_SQL} from calmed
)
select * replace (case when tool_quiet then null else result_text end as result_text) from flagged
"""


@dataclass(frozen=True)
class Scan:
    """The facts of the pending steps (``FACTS_COLUMNS`` plus the three flags) and
    the tool definitions of their traces."""

    facts: pa.Table
    defs: Definitions


def read_scan(con: duckdb.DuckDBPyConnection, pending: pa.Table, max_iterations: int | None,
              received_from: int = 0) -> Scan:
    """Read the facts and tool definitions of the ``pending`` builds (trace_id, build_id) in one pass.

    ``received_from``: no span of these traces arrived earlier (0: unknown); the spans files' row
    groups that all arrived before it are skipped on their statistics.
    """
    con.register("pending", pending)
    try:
        params = {"max_iterations": max_iterations, "received_from": received_from}
        table = con.sql(SCAN_SQL, params=params).to_arrow_table()
    finally:
        con.unregister("pending")
    defs = definitions_from(_definition_entries(table))
    steps = table.drop_columns(["span_trace_id", "definitions"])
    if steps.column("span_id").null_count:  # spans of the traces that are not steps (yet)
        steps = steps.filter(pc.is_valid(steps.column("span_id")))
    return Scan(steps, defs)


def _definition_entries(table: pa.Table) -> list[tuple[str, str, str | None]]:
    """(trace_id, key, value) of every definition entry, in row order and map order."""
    has = pc.fill_null(pc.greater(pc.list_value_length(table.column("definitions")), 0), False)
    if not pc.any(has).as_py():
        return []
    picked = table.select(["span_trace_id", "definitions"]).filter(has)
    return [(trace_id, e["key"], e["value"])
            for trace_id, entries in zip(picked.column(0).to_pylist(), picked.column(1).to_pylist(), strict=True)
            for e in entries]


# The input texts of some steps, by (trace_id, span_id) in ``wanted``.
INPUT_TEXTS_SQL = """
select s.trace_id, s.span_id, s.input_text from spans_all s
semi join wanted w on w.trace_id = s.trace_id and w.span_id = s.span_id
where s.received_unix_nano >= $received_from
"""


def with_input_texts(con: duckdb.DuckDBPyConnection, steps: pa.Table, defs: Definitions,
                     received_from: int = 0) -> pa.Table:
    """``steps`` (scanned facts) with the input_text of the steps whose rules read it.

    ``rules.args_problem`` reads a tool step's input text only when it has no explicit arguments
    (``tool_args`` None or blank), and it matters only against a schema of the tool in the trace.
    """
    wanted = _reads_input(steps, defs)
    if not wanted.any():
        return steps
    keys = steps.select(["trace_id", "span_id"]).filter(pa.array(wanted))
    con.register("wanted", keys)
    try:
        texts = {(t, s): x for t, s, x in con.execute(INPUT_TEXTS_SQL, {"received_from": received_from}).fetchall()}
    finally:
        con.unregister("wanted")
    pairs = zip(steps.column("trace_id").to_pylist(), steps.column("span_id").to_pylist(), wanted, strict=True)
    column = pa.array([texts.get((t, s)) if w else None for t, s, w in pairs], pa.string())
    return steps.set_column(steps.schema.get_field_index("input_text"), "input_text", column)


def _reads_input(steps: pa.Table, defs: Definitions) -> np.ndarray:
    if not defs:
        return np.zeros(steps.num_rows, dtype=bool)
    cols = [steps.column(c).to_pylist() for c in ("trace_id", "step_type", "tool_name", "step_name", "tool_args")]
    return np.fromiter((step_type == "tool" and not (args or "").strip()
                        and tool_schema(defs, trace_id, step_tool(tool, name, step_type)) is not None
                        for trace_id, step_type, tool, name, args in zip(*cols, strict=True)),
                       dtype=bool, count=steps.num_rows)
