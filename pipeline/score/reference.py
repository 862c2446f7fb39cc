"""The per-step rule pass, kept as the reference: ``rules.table.score_step`` on every pending step, then
``paramgen`` on the rows it made.

``score_store`` reads the steps with ``scan`` and scores them with ``columnar`` (quiet steps
column-wise, the others once per distinct set of facts); it must write exactly the rows this
loop makes. tests/score/test_columnar.py compares both on generated and real-instrumentation
stores, and bench/score.py times both in the same run.
"""

from __future__ import annotations

import duckdb

from tracedag.pipeline.score import inputs, paramgen
from tracedag.pipeline.score.rows import ScoreRow, to_table
from tracedag.pipeline.score.rules.table import score_step

BATCH_ROWS = 50_000


def reference_rows(con: duckdb.DuckDBPyConnection, max_iterations: int | None = None) -> list[ScoreRow]:
    """The rule rows of every step of the latest builds that have no rule rows yet, one step at a time."""
    pending = inputs.pending_rule_builds(con)
    inputs.use_pending(con, pending)
    try:
        defs = inputs.tool_definitions(con)
        reader = con.sql("select * from score_facts").to_arrow_reader(BATCH_ROWS)
        rows = [row for batch in reader for r in batch.to_pylist()
                for row in score_step(inputs.facts_from_row(r, defs, max_iterations))]
        # the LLM steps that emitted the tool calls whose arguments failed (paramgen)
        calls = inputs.emitted_tool_calls(con, defs)
        return rows + paramgen.upstream_rows(con, pending, to_table(rows), calls, defs)
    finally:
        inputs.done_pending(con)
