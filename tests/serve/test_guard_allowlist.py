"""The SQL guard decides on the parsed tree with allowlists (#29 item 9): the bypasses of the issue,
what stays allowed (every named query, the store's macros and analysis views), and the real server."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.serve.serve_support import Server
from tracedag import queries
from tracedag.pipeline.serve.sqlguard import DENIED_FUNCTIONS, catalog, default_catalog, refuse
from tracedag.pipeline.store.views import connect
from tracedag.schemas.layout import table_dir


@pytest.fixture(scope="module")
def server(plain_server: Server) -> Server:
    """The worker's plain server of ``serve_store`` (tests/serve/serve_support.py): this module only reads."""
    return plain_server


def _bypasses(store: Path) -> list[tuple[str, str]]:
    """(statement, what the refusal must name)."""
    saved = next(iter(sorted(store.rglob("*.parquet"))))
    return [
        ("select * from range(1) t, lateral duckdb_settings()", "duckdb_settings"),
        ("select * from range(1) t, lateral test_all_types()", "test_all_types"),
        ("select * from spans s join lateral duckdb_functions() f on true", "duckdb_functions"),
        ("select * from (from read_text('/etc/passwd'))", "read_text"),
        ("select (select content from read_text('/etc/passwd'))", "read_text"),
        ("from spans positional join read_blob('/etc/passwd')", "read_blob"),
        (f"summarize '{saved}'", "SUMMARIZE"),
        (f"select * from (summarize '{saved}')", "SUMMARIZE"),
        (f"describe '{saved}'", str(saved)),
        (f"select * from '{saved}'", str(saved)),
        ("select * from duckdb_views", "duckdb_views"),
        ("select * from (with duckdb_views as (select 1) select 1), duckdb_views", "duckdb_views"),
        ("select * from information_schema.tables", "catalog or schema"),
        ('select "read_text"(\'/etc/passwd\')', "read_text"),
        ("select main.current_setting('home_directory')", "current_setting"),
        ("select version()", "version"),
        ("select nextval('s')", "nextval"),
        ("from query('select 1')", "query"),
        ("pivot spans on name using count(*)", "PIVOT"),
    ]


def test_the_bypasses_of_the_issue_are_refused_naming_the_node_or_function(serve_store: Path) -> None:
    for sql, named in _bypasses(serve_store):
        reason = refuse(sql)
        assert reason is not None and named in reason, (sql, reason)


def test_over_the_real_server_they_are_400_with_the_reason(server: Server, serve_store: Path) -> None:
    c = server.client()
    for sql, named in _bypasses(serve_store):
        r = c.post("/api/sql", content=sql)
        assert r.status_code == 400 and named in r.json()["error"], (sql, r.status_code, r.text[:200])


def test_queries_scalars_aggregates_windows_and_the_store_macros_are_served(server: Server) -> None:
    c = server.client()
    allowed = {
        "select count(*) > 0 as ok from spans s, lateral (select s.span_id) x": [{"ok": True}],
        "select count(*) > 0 as ok from model_prices()": [{"ok": True}],
        "with t as (select trace_id, row_number() over (order by trace_id) n from traces) "
        "select max(n) = count(*) as ok from t": [{"ok": True}],
        "select list_sort([3, 1, 2]) as l, upper('a') || 'b' as s, coalesce(null, 1) as c": [
            {"l": [1, 2, 3], "s": "Ab", "c": 1}],
        "select sum(x) as s from range(4) r(x) where x in (select unnest([1, 2, 3]))": [{"s": 6}],
    }
    for sql, rows in allowed.items():
        r = c.post("/api/sql", content=sql)
        assert r.status_code == 200 and r.json()["rows"] == rows, (sql, r.text[:300])
    described = c.post("/api/sql", content="describe spans")
    assert described.status_code == 200 and described.json()["rows"]


def test_every_named_query_passes_with_the_catalog_of_a_store_with_analysis_outputs(tmp_path: Path) -> None:
    for name in ("run_paths", "node_visits", "determinism", "node_utility", "edge_utility"):
        d = table_dir(tmp_path, name)
        d.mkdir(parents=True)
        pq.write_table(pa.table({"x": [1]}), d / "part-0.parquet")
    con = connect(tmp_path)
    try:
        names = catalog(con)
    finally:
        con.close()
    assert {"run_paths", "determinism", "spans", "traces_all"} <= names.views
    assert {"model_prices", "failure_graph"} <= names.macros
    for name in queries.names():
        assert refuse(queries.load(name), names) is None, name
    assert "run_paths" not in default_catalog().views  # an empty store has no analysis views
    assert refuse("select * from run_paths") is not None


def test_denied_scalars_exist_in_duckdb_and_table_functions_are_never_scalars() -> None:
    for name, call in {"current_setting": "current_setting('threads')", "version": "version()",
                       "nextval": "nextval('s')", "write_log": "write_log('x')",
                       "getvariable": "getvariable('__tracedag_data')"}.items():
        assert name in DENIED_FUNCTIONS
        assert name in (refuse(f"select {call}") or ""), call
    assert "read_text" in (refuse("select read_text('/etc/passwd')") or "")
