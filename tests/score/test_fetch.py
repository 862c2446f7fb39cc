"""``store.fetch.arrow``: a query's rows as Arrow, planned once, equal to the relation's, without DuckDB's warning."""

from __future__ import annotations

import warnings
from pathlib import Path

import duckdb

from tracedag import queries
from tracedag.pipeline.store.fetch import arrow
from tracedag.pipeline.store.querying import bind_params, to_arrow
from tracedag.pipeline.store.views import connect


def test_the_rows_and_types_of_the_relation_and_no_warning(rca_store: Path) -> None:
    con = connect(rca_store)
    try:
        for name, given in (("root_causes", {"per": "conversation"}), ("trace_summary", {})):
            values = bind_params(queries.describe(name), given)
            sql = queries.load(name)
            with warnings.catch_warnings(record=True) as seen:
                got = arrow(con, sql, values)
            assert not [w for w in seen if "Arrow output" in str(w.message)]
            want = to_arrow(con.sql(sql, params=values))
            assert got.schema == want.schema
            assert got.num_rows == want.num_rows > 0
        assert arrow(con, "select ? as a, ? as b", [1, "x"]).to_pylist() == [{"a": 1, "b": "x"}]
        assert arrow(con, "select $n as n", {"n": 2}).to_pylist() == [{"n": 2}]
    finally:
        con.close()


def test_a_plain_connection_fetches_too() -> None:
    con = duckdb.connect(":memory:")
    try:
        assert arrow(con, "select range as i from range(3)").column("i").to_pylist() == [0, 1, 2]
    finally:
        con.close()
