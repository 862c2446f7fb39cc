"""One read of everything the rules need for a chunk of pending builds.

``read_scan(con, pending, max_iterations)`` joins the pending steps with the spans of their
traces once: the step facts (``inputs.FACTS_COLUMNS``, without texts no rule reads) with
three flags computed in SQL, the tool definitions of every span of those traces (spans not
in the DAG too, as ``inputs.DEFINITIONS_SQL`` reads them) and the tool calls in the output of
their LLM steps (kept for the traces that define tools: ``paramgen`` checks them). Reading both in
the same pass spares more scans of the ``attributes`` column, the largest one.

- ``quiet``: ``inputs.QUIET_SQL`` (calm, not a tool step, no empty-looking LLM output), a step no
  rule can fire on;
- ``tool_calm``: a calm tool step (``inputs.CALM_SQL``): only its result, its arguments and its
  tool's schema can make a rule fire, which ``columnar`` decides;
- ``tool_quiet``: a calm tool step whose result can neither report an error nor be empty: no
  result, or an object (first character ``{``, not ``{}``) without any key
  ``rules.table.RESULT_KEY_HINTS`` names (``columnar`` asks the rules about the other results).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracedag.pipeline.score.inputs import (
    CALL_ENTRIES_SQL,
    CALM_SQL,
    DEFINITION_ENTRIES_SQL,
    Calls,
    Definitions,
    calls_from,
    definitions_from,
    facts_columns,
    quiet_sql,
    step_tool,
    tool_schema,
)
from tracedag.pipeline.score.rules.table import RESULT_KEY_HINTS
from tracedag.pipeline.store.files import parquet_files
from tracedag.pipeline.store.query_macros import data_of
from tracedag.pipeline.store.remote import remote_of
from tracedag.pipeline.store.views import read_list_sql

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

# Attribute entries that may hold tool definitions (toolschema.span_definitions decides), and on LLM
# steps those that may hold the tool calls of the output (toolschema.emitted_calls).
_CALLS = f"case when n.step_type = 'llm' then {CALL_ENTRIES_SQL} end"

# ``__spans__``: the raw spans relation (``recent_spans``).
SCAN_SQL = f"""
with nodes as (  -- pending holds latest builds: their nodes, without the dag_nodes view's own pick
    select n.* from dag_nodes_all n semi join pending p on p.trace_id = n.trace_id and p.build_id = n.build_id
), traced as (  -- no rule reads conversation_id: the raw spans, from the earliest arrival that can matter
    select s.* from __spans__ s semi join pending p on p.trace_id = s.trace_id
    where s.received_unix_nano >= $received_from
), facts as (
    select {_SCAN_COLUMNS}, s.trace_id as span_trace_id, {DEFINITION_ENTRIES_SQL} as definitions, {_CALLS} as calls
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
    calls: Calls = field(default_factory=dict)  # the tool calls LLM steps emitted, in traces with definitions


def read_scan(con: duckdb.DuckDBPyConnection, pending: pa.Table, max_iterations: int | None,
              received_from: int = 0) -> Scan:
    """Read the facts and tool definitions of the ``pending`` builds (trace_id, build_id) in one pass.

    ``received_from``: no span of these traces arrived earlier (0: unknown); the spans files' row
    groups that all arrived before it are skipped on their statistics.
    """
    con.register("pending", pending)
    try:
        params = {"max_iterations": max_iterations, "received_from": received_from}
        sql = SCAN_SQL.replace("__spans__", recent_spans(con, received_from))
        table = con.sql(sql, params=params).to_arrow_table()  # a large result: fetch.arrow would copy it
    finally:
        con.unregister("pending")
    defs = definitions_from(_entries(table, ["span_trace_id", "definitions"]))
    calls = calls_from(_entries(_in_traces(table, defs), ["trace_id", "span_id", "calls"])) if defs else {}
    steps = table.drop_columns(["span_trace_id", "definitions", "calls"])
    if steps.column("span_id").null_count:  # spans of the traces that are not steps (yet)
        steps = steps.filter(pc.is_valid(steps.column("span_id")))
    return Scan(steps, defs, calls)


def recent_spans(con: duckdb.DuckDBPyConnection, received_from: int) -> str:
    """The relation a read of the spans that arrived from ``received_from`` on takes (``recent_files``; 0: every
    spans file, ``spans_all``)."""
    return recent_files(con, "spans", "received_unix_nano", received_from) if received_from > 0 else "spans_all"


def recent_files(con: duckdb.DuckDBPyConnection, table: str, column: str, bound: int | str) -> str:
    """The relation a read of the rows of the core table ``table`` whose ``column`` is at least ``bound`` takes:
    the table's files of ``con``'s store that hold any (``dag.chunks.reaching``, per their footers, read once per
    file version), listed now, as ``read_parquet([...])``; ``<table>_all`` (every file, each opened to be skipped
    on its statistics) in an object store (whose views keep one row per span across writers), or when no file is
    left. The same rows as ``<table>_all`` once the query filters on the bound."""
    data = data_of(con)
    if data is None or remote_of(data) is not None:
        return f"{table}_all"
    # here: it imports polars, which a live round has and ``tracedag score`` need not
    from tracedag.pipeline.dag.chunks import reaching

    files = reaching(parquet_files(data, table), column, bound)
    return f"(select * from {read_list_sql(data, files)})" if files else f"{table}_all"


def _in_traces(table: pa.Table, defs: Definitions) -> pa.Table:
    """The rows of ``table`` in the traces that define tools."""
    return table.filter(pc.is_in(table.column("trace_id"), value_set=pa.array(list(defs), pa.string())))


def _entries(table: pa.Table, columns: list[str]) -> list[tuple[Any, ...]]:
    """The rows whose list column (the last of ``columns``) is not empty: the other columns, then the
    list as (key, value) pairs in map order; rows in table order."""
    entries = table.column(columns[-1])
    has = pc.fill_null(pc.greater(pc.list_value_length(entries), 0), False)
    if not pc.any(has).as_py():
        return []
    picked = table.select(columns).filter(has)
    cols = [picked.column(c).to_pylist() for c in columns]
    return [(*row[:-1], [(e["key"], e["value"]) for e in row[-1]]) for row in zip(*cols, strict=True)]


# The input texts of some steps, by (trace_id, span_id) in ``wanted``.
INPUT_TEXTS_SQL = """
select s.trace_id, s.span_id, s.input_text from __spans__ s
semi join wanted w on w.trace_id = s.trace_id and w.span_id = s.span_id
where s.received_unix_nano >= $received_from
"""


def with_input_texts(con: duckdb.DuckDBPyConnection, steps: pa.Table, defs: Definitions,
                     received_from: int = 0) -> pa.Table:
    """``steps`` (scanned facts) with the input_text of the steps whose rules read it.

    ``rules.table.args_problem`` reads a tool step's input text only when it has no explicit arguments
    (``tool_args`` None or blank), and it matters only against a schema of the tool in the trace.
    """
    wanted = _reads_input(steps, defs)
    if not wanted.any():
        return steps
    keys = steps.select(["trace_id", "span_id"]).filter(pa.array(wanted))
    con.register("wanted", keys)
    try:
        sql = INPUT_TEXTS_SQL.replace("__spans__", recent_spans(con, received_from))
        texts = {(t, s): x for t, s, x in con.execute(sql, {"received_from": received_from}).fetchall()}
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
