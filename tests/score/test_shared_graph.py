"""The failure graph a materialization round computes once for every stored query (score/sharedgraph.py).

Inside ``shared_failure_graph`` each stored query gives exactly the rows its SQL gives on a plain connection,
and it gives them from the kept rows (emptying those empties the answers); a call the kept rows cannot
answer (another threshold) fails loudly; across turns the original definitions still run; on leaving, the
connection answers every call as before.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from tracedag import queries
from tracedag.pipeline.score.sharedgraph import KEPT, shared_failure_graph
from tracedag.pipeline.store.querying import bind_params, to_arrow
from tracedag.pipeline.store.views import connect

CASES = [("failures", {}), ("propagation", {}), ("root_causes", {}), ("root_causes", {"per": "conversation"}),
         ("workflow_scores", {}), ("trace_summary", {})]


def _rows(con: duckdb.DuckDBPyConnection, name: str, given: dict[str, str]) -> list[dict[str, object]]:
    values = bind_params(queries.describe(name), given)
    rows = to_arrow(con.sql(queries.load(name), params=values)).to_pylist()
    # DuckDB sums in parallel: a weighted mean may differ in its last bits between two runs of the same SQL
    return [{k: float(f"{v:.12g}") if isinstance(v, float) else v for k, v in r.items()} for r in rows]


def _every_case(data: Path) -> dict[str, list[dict[str, object]]]:
    con = connect(data)
    try:
        return {f"{n} {g}": _rows(con, n, g) for n, g in CASES}
    finally:
        con.close()


@pytest.mark.parametrize("fixture", ["query_store", "rca_store"])
def test_every_stored_query_reads_the_shared_graph_and_gives_the_rows_of_its_sql(
        fixture: str, request: pytest.FixtureRequest) -> None:
    data: Path = request.getfixturevalue(fixture)
    want = _every_case(data)
    assert any(want[f"{n} {g}"] for n, g in CASES if n == "root_causes")
    con = connect(data)
    try:
        with shared_failure_graph(con) as share:
            assert share()
            assert {f"{n} {g}": _rows(con, n, g) for n, g in CASES} == want
            assert share()  # shared again on the same connection (a round's next part): the same rows
            assert {f"{n} {g}": _rows(con, n, g) for n, g in CASES} == want
            con.execute(f"delete from {KEPT}failure_steps_rows")  # the queries read the kept rows...
            con.execute(f"delete from {KEPT}failure_dag_rows")
            con.execute(f"delete from {KEPT}failure_dag_roots_rows")
            assert _rows(con, "failures", {}) == []
            assert _rows(con, "root_causes", {}) == []
            assert _rows(con, "root_causes", {"per": "conversation"}) == []  # ...across turns too (its steps)
        assert {f"{n} {g}": _rows(con, n, g) for n, g in CASES} == want  # the macros are the originals again
        assert not con.sql(f"select * from duckdb_tables() where table_name like '{KEPT}%'").fetchall()
    finally:
        con.close()


def test_a_call_the_shared_rows_cannot_answer_fails_and_the_originals_answer_it_after(rca_store: Path) -> None:
    con = connect(rca_store)
    try:
        plain = _rows(con, "failures", {"fail_threshold": "3.0"})
        assert plain
        with shared_failure_graph(con) as share, pytest.raises(duckdb.Error, match="p_fail_threshold is not 2.0"):
            assert share()
            _rows(con, "failures", {"fail_threshold": "3.0"})
        assert _rows(con, "failures", {"fail_threshold": "3.0"}) == plain
    finally:
        con.close()
