"""A shared failure graph within traces only (score/sharedgraph.py ``across_turns``).

A materialization round runs the stored queries per trace but one (root causes per conversation); within traces
only, the two graph macros read the kept rows and never bind the originals, and each query still gives the rows
of its SQL on a plain connection. A call across turns then fails loudly; made across turns again, it gives its
rows.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from tracedag import queries
from tracedag.pipeline.score.sharedgraph import KEPT, across_turns, shared_failure_graph
from tracedag.pipeline.store.procdb import VISIBLE
from tracedag.pipeline.store.querying import bind_params, to_arrow
from tracedag.pipeline.store.views import connect

WITHIN = [("failures", {}), ("propagation", {}), ("root_causes", {}), ("workflow_scores", {}), ("trace_summary", {})]
ACROSS = ("root_causes", {"per": "conversation"})


def _rows(con: duckdb.DuckDBPyConnection, name: str, given: dict[str, str]) -> list[dict[str, object]]:
    values = bind_params(queries.describe(name), given)
    rows = to_arrow(con.sql(queries.load(name), params=values)).to_pylist()
    # DuckDB sums in parallel: a weighted mean may differ in its last bits between two runs of the same SQL
    return [{k: float(f"{v:.12g}") if isinstance(v, float) else v for k, v in r.items()} for r in rows]


def _definition(con: duckdb.DuckDBPyConnection, name: str) -> str:
    found = con.execute(f"select macro_definition from duckdb_functions() where function_name = ? and {VISIBLE} "
                        "order by database_name = current_database() desc", [name]).fetchall()  # its own first
    return str(found[0][0])


def test_within_traces_the_macros_read_only_the_kept_rows_and_give_the_rows_of_the_sql(rca_store: Path) -> None:
    con = connect(rca_store)
    try:
        want = {f"{n} {g}": _rows(con, n, g) for n, g in [*WITHIN, ACROSS]}
        assert want["root_causes {}"] and want["root_causes {'per': 'conversation'}"]
        with shared_failure_graph(con) as share:
            assert share()
            across_turns(con, False)
            for name in ("failure_dag", "failure_dag_roots"):
                assert f"{KEPT}{name}(" not in _definition(con, name)  # the original is not reached
            assert {f"{n} {g}": _rows(con, n, g) for n, g in WITHIN} == {f"{n} {g}": want[f"{n} {g}"] for n, g in WITHIN}
            with pytest.raises(duckdb.Error, match="shared within traces only"):
                _rows(con, *ACROSS)
            across_turns(con, True)
            assert _rows(con, *ACROSS) == want[f"{ACROSS[0]} {ACROSS[1]}"]
            assert {f"{n} {g}": _rows(con, n, g) for n, g in WITHIN} == {f"{n} {g}": want[f"{n} {g}"] for n, g in WITHIN}
            con.execute(f"delete from {KEPT}failure_dag_roots_rows")  # within traces, the kept rows are read
            across_turns(con, False)
            assert _rows(con, "root_causes", {}) == []
        assert {f"{n} {g}": _rows(con, n, g) for n, g in [*WITHIN, ACROSS]} == want  # the originals again
    finally:
        con.close()


def test_a_connection_not_shared_is_left_as_it_is(rca_store: Path) -> None:
    con = connect(rca_store)
    try:
        before = _definition(con, "failure_dag")
        across_turns(con, False)
        assert _definition(con, "failure_dag") == before
        assert _rows(con, *ACROSS)
    finally:
        con.close()
