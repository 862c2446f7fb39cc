"""Named queries on a store whose newest builds are not all materialized yet: stored rows, and SQL for the rest.

A live round of ``tracedag collect --build`` may leave the materialization of its traces to a later
round. Until then ``materialized.freshness`` names the traces the stored rows do not answer: every
trace of a conversation one of whose traces has a latest build without stored rows (a later turn
changes the earlier turns' rows). ``read`` answers a materialized named query with the stored rows of
every other trace and the query's SQL over views whose ``traces`` hold only those traces (the scope a
materialize round computes them in, so they are the rows it would store), in the query's order. The
SQL stays the reference: tests/queries/test_materialized.py checks that both give the same rows.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from tracedag.pipeline.store import current_rounds, materialized
from tracedag.pipeline.store.views import _LATEST, restrict_traces

logger = logging.getLogger(__name__)

SCOPE = "__tracedag_mixed_scope"


def read(con: duckdb.DuckDBPyConnection, data: Path, name: str, sql: str,
         values: dict[str, object]) -> pa.Table | None:
    """``name``'s result from its stored rows and its SQL (``sql``, ``values``) over the traces they do not
    answer; None when the stored rows answer every trace or too few (then one statement does it all).

    Restricts ``con``'s ``traces`` view: for a connection of its own (``querying.run_named``)."""
    if not materialized.matches(name, values):
        return None
    state = materialized.freshness(con, data)
    if not state.usable or not state.stale:
        return None
    con.register(SCOPE, pa.table({"trace_id": pa.array(state.stale, pa.string())}))
    stored = _stored(con, data, name, values)
    _restrict(con, len(state.stale))
    computed = _arrow(con.sql(sql, params=values or None))
    logger.info("query %s: %d stored rows, %d computed for %d traces not materialized yet",
                name, stored.num_rows, computed.num_rows, len(state.stale))
    return ordered(name, stored, computed)


COPY_TRACES = 5_000
"""Up to this many traces computed from the SQL (a live round's backlog), the rows of those traces in the tables
sorted by trace id are copied first: a named query's SQL scans ``traces`` a dozen times and ``step_scores``,
``dag_nodes``, ``dag_edges`` several times, each a semi join on the traces' ids over the whole table (root_causes
over 10 traces on 1M spans: 1.25 -> 0.74 s CPU, 300 traces 2.4 -> 1.6 s). ``spans`` is not sorted by trace: a copy
reads most of its row groups whole, so it stays filtered in place. More traces: filtered in place (memory)."""
_COPIED = ("traces", "dag_nodes", "dag_edges", "step_scores")


def _restrict(con: duckdb.DuckDBPyConnection, traces: int) -> None:
    """Make ``con``'s refined views hold only the traces of ``SCOPE`` (``views.restrict_traces``), those of the
    tables sorted by trace id over a copy of their rows when they are few (``COPY_TRACES``)."""
    restrict_traces(con, SCOPE)
    if traces > COPY_TRACES:
        return
    for table in _COPIED:
        copy = f"{SCOPE}_{table}"
        con.execute(f"create or replace temp table {copy} as select * from {table}_all "
                    f"where trace_id in (select trace_id from {SCOPE})")
        body = re.sub(rf"\bfrom {table}_all\b", f"from {copy}", _LATEST[table])
        assert body != _LATEST[table], table
        con.execute(f"create or replace view {table} as {body}")


def _stored(con: duckdb.DuckDBPyConnection, data: Path, name: str, values: dict[str, object]) -> pa.Table:
    """The stored rows of the traces not in ``SCOPE``; of a whole store through the kept current rounds
    (``current_rounds``), unless a round or a collection changed them meanwhile (then the SQL's own join)."""
    params = materialized.reader_values(name, values)
    one, whole = materialized.scope_flags(values)
    current = current_rounds.register(con, data) if whole and not one else None
    if current is not None:
        reader = materialized.reader_sql(name, one, whole, skip=SCOPE, current=current_rounds.RELATION)
        table = _arrow(con.sql(reader, params=params))
        if current_rounds.listing(data) == current.listing:
            return table
    return _arrow(con.sql(materialized.reader_sql(name, one, whole, skip=SCOPE), params=params))


def _arrow(relation: duckdb.DuckDBPyRelation) -> pa.Table:
    fetch = getattr(relation, "to_arrow_table", None) or relation.arrow
    table: pa.Table = fetch()
    return table


def ordered(name: str, stored: pa.Table, computed: pa.Table) -> pa.Table:
    """The two parts as one table in the query's order (``materialized.SPECS``; nulls last, as DuckDB)."""
    if stored.schema.names != computed.schema.names:
        raise ValueError(f"{name}: stored columns {stored.schema.names} differ from the SQL's {computed.schema.names}")
    both = pa.concat_tables([stored.cast(computed.schema), computed])
    keys = [(c.strip(), "ascending") for c in materialized.SPECS[name].order.split(",")]
    return both.take(pc.sort_indices(both, sort_keys=keys)) if both.num_rows else both
