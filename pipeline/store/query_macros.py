"""The named queries as table macros on a connection (``queries.macros``): made for the names a statement
mentions, on demand, each switched to its stored rows when the store is fresh; and the store a connection was
made over (``data_of``: the variable ``views.create_views`` sets, which those stored rows are checked against).

``select * from root_causes(per := 'conversation')`` on a ``views.connect(data, query_macros=True)`` connection.
"""

from __future__ import annotations

import difflib
import logging
import re
import weakref
from pathlib import Path

import duckdb

from tracedag import queries
from tracedag.pipeline.store import freshness, materialized
from tracedag.pipeline.store.cachereads import register_reads
from tracedag.pipeline.store.shared_macros import called_names
from tracedag.queries import macros

logger = logging.getLogger(__name__)


DATA_VARIABLE = "__tracedag_data"
"""A DuckDB variable on every ``connect`` connection: its store (``create_query_macros`` checks it is fresh)."""


def data_of(con: duckdb.DuckDBPyConnection) -> Path | None:
    """The store ``con`` was made over by ``connect`` (None: another connection)."""
    value = con.execute(f"select getvariable('{DATA_VARIABLE}')").fetchall()[0][0]
    return None if value is None else Path(str(value))


_MISSING_TABLE = re.compile(r"Table with name (\S+) does not exist")



def mentioned_queries(sql: str) -> list[str]:
    """The named queries whose names occur as words in ``sql`` outside strings and comments.

    A call of a name close to one (``root_cause(...)``) counts too, so that DuckDB's "Did you mean"
    can name the named query instead of some other function.
    """
    code = macros.code_only(sql, keep_strings=False)
    called = called_names(code)
    near = {hit for word in called for hit in difflib.get_close_matches(word, queries.names(), n=1, cutoff=0.8)}
    return [n for n in queries.names() if n in near or re.search(rf"\b{n}\b", code, re.IGNORECASE)]


# The named-query macros made on each connection: name -> True once its body is in place, False
# while only its wrapper is declared. Asking DuckDB instead (duckdb_functions()) costs 60-150 ms.
_MADE: weakref.WeakKeyDictionary[duckdb.DuckDBPyConnection, dict[str, bool]] = weakref.WeakKeyDictionary()


def declare_query_macros(con: duckdb.DuckDBPyConnection) -> None:
    """Create every named query's wrapper macro over a placeholder body (a few ms; ``create_query_macros`` fills it).

    For a caller that must list the macro names before it knows which ones a statement calls (the
    SQL endpoint's guard reads them from the connection). Calling a wrapper whose body is still the
    placeholder raises.
    """
    made = _MADE.setdefault(con, {})
    todo = [macros.build(n) for n in queries.names() if n not in made]
    if todo:  # one call: 34 small statements cost more in round trips than in binding
        con.execute(";\n".join(sql for m in todo for sql in (m.placeholder, m.wrapper)))
    made.update({m.name: made.get(m.name, False) for m in todo})


def create_query_macros(con: duckdb.DuckDBPyConnection, sql: str | None = None) -> list[str]:
    """Create the table macro of each named query ``sql`` mentions (every one when None); return the statements.

    Binding a body costs 10-120 ms, so connections make only the macros a statement calls; one
    already on ``con`` is kept. A named query whose body does not bind here (it reads an analysis
    table the store does not have yet) becomes a macro that raises saying so when called.
    """
    names = queries.names() if sql is None else mentioned_queries(sql)
    if sql is not None and "://" in sql:  # it may read a store's object by URL: through the store's filesystem
        register_reads(con)
    made = _MADE.setdefault(con, {})
    done: list[str] = []
    fresh: list[str] = []
    for name in names:
        if not made.get(name, False):
            done += _create_query_macro(con, name, name in made)
            made[name] = True
            fresh.append(name)
    return done + _read_materialized(con, fresh)


def _read_materialized(con: duckdb.DuckDBPyConnection, made: list[str]) -> list[str]:
    """Switch the macros just made of materialized queries to their stored rows when the store is fresh."""
    todo = [n for n in made if n in materialized.SPECS]
    data = data_of(con) if todo else None
    if data is None or not freshness.fresh(con, data):
        return []
    done = [sql for n in todo for sql in materialized.switch_statements(n)]
    for sql in done:
        con.execute(sql)
    return done


def _create_query_macro(con: duckdb.DuckDBPyConnection, name: str, declared: bool) -> list[str]:
    macro = macros.build(name)
    done = [] if declared else [macro.placeholder, macro.wrapper]
    for sql in done:
        con.execute(sql)
    try:
        con.execute(macro.body)
        body = macro.body
    except duckdb.Error as e:
        body = macros.stub_sql(name, _unavailable(name, e))
        con.execute(body)
    return [*done, body]


def _unavailable(name: str, error: duckdb.Error) -> str:
    missing = _MISSING_TABLE.search(str(error))
    if missing and isinstance(error, duckdb.CatalogException):
        return f"the store has no table {missing.group(1)} yet (`tracedag queries` says what writes it)"
    logger.exception("named query %s does not bind as a macro", name)
    return f"does not bind on this store: {str(error).strip().splitlines()[0]}"
