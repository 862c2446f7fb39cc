"""Run selections: the one syntax of regress and validate, checked against a real store."""

import pytest

from tracedag.pipeline.store.querying import run_sql
from tracedag.pipeline.store.selection import FROM_SQL, SelectionSyntax, selection_condition


def _picked(data, text):
    sql = f"select t.trace_id from {FROM_SQL} where {selection_condition(text)} order by 1"
    return run_sql(data, sql).column("trace_id").to_pylist()


def test_labels_globs_and_sql(query_store):
    every = run_sql(query_store, "select trace_id from traces order by 1").column("trace_id").to_pylist()
    one = every[0]
    assert _picked(query_store, f"trace_id={one}") == [one]
    assert _picked(query_store, f"trace_id={one[:3]}*") == [t for t in every if t.startswith(one[:3])]
    assert _picked(query_store, f"sql: t.trace_id = '{one}'") == [one]
    assert _picked(query_store, "trace_id=no-such-trace") == []
    assert _picked(query_store, "trace_id=x'; drop table traces; --") == []  # a value is a literal


@pytest.mark.parametrize("text", ["v1", "=v1", "a b=1", "key=", "sql:", "sql:   "])
def test_malformed_selections_say_what_is_expected(text):
    with pytest.raises(SelectionSyntax, match="expected key=value|sql: needs a condition"):
        selection_condition(text)
