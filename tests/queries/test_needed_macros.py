"""The shared macros a statement needs (``shared_macros.create_shared_macros(con, sql)``): only those it calls and the
ones they call are bound, in their files' order, each once a connection; the answers are those of a connection
with every shared macro (``connect()``), on the hand-built store of tests/queries/rca_store.py."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from tracedag import queries
from tracedag.pipeline.store.querying import bind_params, query_doc
from tracedag.pipeline.store.shared_macros import (
    create_shared_macros,
    needed_shared_macros,
    shared_macro_names,
)
from tracedag.pipeline.store.views import connect
from tracedag.queries.macros import statements


def made(con: duckdb.DuckDBPyConnection) -> set[str]:
    rows = con.execute("select function_name from duckdb_functions() where function_type = 'table_macro' "
                       "and database_name = current_database()").fetchall()
    return {r[0] for r in rows} & shared_macro_names()


def test_a_statement_gets_the_macros_it_calls_and_theirs_only(rca_store: Path) -> None:
    con = connect(rca_store, shared_macros=False, private=True)
    create_shared_macros(con, queries.load("failures"))
    assert made(con) == {"trace_window", "failure_steps"}
    # failure_roots calls failure_dag_roots, which calls failure_dag, which calls failure_steps and conversation_turns
    create_shared_macros(con, "select count(*) from failure_roots(2.0, (select list(trace_id) from traces), 10)")
    assert made(con) == {"trace_window", "failure_steps", "conversation_turns", "failure_dag", "failure_dag_roots",
                         "failure_roots"}
    create_shared_macros(con, "select 'failure_graph(' -- span_costs(\n, 1")  # in a string and a comment: no call
    assert "failure_graph" not in made(con) and "span_costs" not in made(con)
    create_shared_macros(con, queries.load("step_stats"))  # span_costs calls model_prices, in the other file
    assert {"span_costs", "model_prices"} <= made(con) and "workflow_weights" not in made(con)
    create_shared_macros(con)  # every one
    assert made(con) == shared_macro_names()


def test_the_needed_macros_follow_the_statement_text() -> None:
    """The list is kept per statement text: another text (a query edited, another query) gets its own."""
    one = [name for name, _ in needed_shared_macros("from failure_dag(1.0, [], 3, false)")]
    assert one == ["failure_steps", "conversation_turns", "failure_dag"]  # the order of _failure_graph.sql
    assert [name for name, _ in needed_shared_macros("from failure_graph(1.0, [], 3)")] == [*one, "failure_graph"]
    assert needed_shared_macros("select 1") == ()
    texts = [text for _, text in needed_shared_macros("from failure_roots(1.0, [], 3)")]
    assert all(text.lstrip().lower().startswith(("create", "--")) for text in texts)


def test_a_macro_made_on_one_connection_is_not_taken_as_made_on_another(rca_store: Path) -> None:
    first = connect(rca_store, shared_macros=False, private=True)
    create_shared_macros(first, queries.load("failures"))
    second = connect(rca_store, shared_macros=False, private=True)
    create_shared_macros(second, queries.load("failures"))
    assert made(second) == {"trace_window", "failure_steps"}


@pytest.mark.parametrize("name", [n for n in queries.names() if needed_shared_macros(queries.load(n))])
def test_each_named_query_answers_with_its_macros_alone_as_with_all(rca_store: Path, name: str) -> None:
    values = bind_params(query_doc(name), {})
    sql = queries.load(name)
    whole = connect(rca_store)
    expected = whole.sql(sql, params=values or None).fetchall()
    con = connect(rca_store, shared_macros=False, private=True)
    create_shared_macros(con, sql)
    assert made(con) < shared_macro_names()
    assert con.sql(sql, params=values or None).fetchall() == expected


def test_a_file_is_cut_into_statements_at_semicolons_outside_strings_and_comments() -> None:
    text = "select ';' as \"a;b\" -- ;\n; /* ; */ create macro m() as table select 2;\n-- only a comment\n"
    assert statements(text) == ["select ';' as \"a;b\" -- ;\n", " /* ; */ create macro m() as table select 2"]
    for file in queries.macro_files():  # as DuckDB's parser cuts them
        ours = [s.strip().rstrip(";") for s in statements(queries.load(file))]
        assert ours == [s.query.strip().rstrip(";") for s in duckdb.extract_statements(queries.load(file))]
