"""The table macros of ``queries/_*.sql`` that the named queries call (``failure_steps``, ``span_costs``, ...): which
ones a statement needs, and making them on a DuckDB connection, each once (``views.connect`` makes every one)."""

from __future__ import annotations

import functools
import re
import weakref

import duckdb

from tracedag import queries
from tracedag.queries import macros

_CALLED = re.compile(r"\b([A-Za-z_]\w*)\s*\(")


def create_shared_macros(con: duckdb.DuckDBPyConnection, sql: str | None = None) -> None:
    """The table macros of ``queries/_*.sql`` the named queries call: every one (``sql`` None: binding them all
    costs ~45 ms CPU), else those ``sql`` calls and the ones they call, in their files' order, each one not made
    on ``con`` by an earlier call with ``sql`` (``failures`` needs 2 of the 10, ~12 ms; ``step_stats`` 2, ~5 ms).

    A connection's macros are what they were whichever way they were made: DuckDB binds a macro's body again
    where it is called, over the views of that moment. So a connection of the process's database (``procdb``)
    makes none: the macros are made once per process in a catalog of their own, which ``views.create_views`` puts
    on the connection's search path after its own catalog (its views, and any macro it makes, come first)."""
    if con in _ON_PATH:
        return
    if sql is None:
        for name in queries.macro_files():
            con.execute(queries.load(name))
        _SHARED[con] = set(shared_macro_names())
        return
    made = _SHARED.setdefault(con, set())
    todo = [(name, text) for name, text in needed_shared_macros(sql) if name not in made]
    if todo:  # one call: a separate statement's round trip costs ~0.3 ms
        con.execute("\n;\n".join(text for _, text in todo))  # a statement may end in a -- comment
        made.update(name for name, _ in todo)


def on_search_path(con: duckdb.DuckDBPyConnection) -> None:
    """Say that ``con`` reads every shared macro through its search path (``views.create_views`` put the process's
    catalog of them there): ``create_shared_macros`` then makes none on it."""
    _ON_PATH.add(con)


_ON_PATH: weakref.WeakSet[duckdb.DuckDBPyConnection] = weakref.WeakSet()


# The shared macros ``create_shared_macros(con, sql)`` made on each connection (every one after a call without sql).
_SHARED: weakref.WeakKeyDictionary[duckdb.DuckDBPyConnection, set[str]] = weakref.WeakKeyDictionary()


_SHARED_MACRO = re.compile(r"\bmacro\s+([A-Za-z_]\w*)\s*\(", re.IGNORECASE)


@functools.cache
def _shared_statements() -> tuple[tuple[str, str, frozenset[str]], ...]:
    """Each statement of ``queries/_*.sql`` in the files' order: the name of the macro it makes, its text and the
    words it calls (outside strings and comments). Read once a process."""
    found: list[tuple[str, str, frozenset[str]]] = []
    for file in queries.macro_files():
        for statement in macros.statements(queries.load(file)):
            code = macros.code_only(statement, keep_strings=False)
            made = [m.group(1).lower() for m in _SHARED_MACRO.finditer(code)]
            if len(made) != 1:
                raise ValueError(f"queries/{file}.sql: a statement must make one macro, not {made or 'none'}")
            found.append((made[0], statement, called_names(code)))
    return tuple(found)


def called_names(code: str) -> frozenset[str]:
    """The names called (``name(``) in ``code``, lower case."""
    return frozenset(m.group(1).lower() for m in _CALLED.finditer(code))


@functools.cache
def shared_macro_names() -> frozenset[str]:
    """The names of the table macros ``create_shared_macros`` makes (read from ``queries/_*.sql``)."""
    return frozenset(name for name, _, _ in _shared_statements())


@functools.lru_cache(maxsize=256)
def needed_shared_macros(sql: str) -> tuple[tuple[str, str], ...]:
    """(name, statement) of the shared macros ``sql`` calls and of those they call, in their files' order."""
    statements = _shared_statements()
    wanted = called_names(macros.code_only(sql, keep_strings=False)) & shared_macro_names()
    while True:  # the macros the wanted ones call, until none is new
        more = frozenset().union(*(calls for name, _, calls in statements if name in wanted)) & shared_macro_names()
        if more <= wanted:
            return tuple((name, text) for name, text, _ in statements if name in wanted)
        wanted |= more


def calls_shared_macros(sql: str) -> bool:
    """Whether ``sql`` calls a shared macro (outside strings and comments): only then must a connection
    made with ``shared_macros=False`` bind them (``create_shared_macros``) before running it."""
    return not called_names(macros.code_only(sql, keep_strings=False)).isdisjoint(shared_macro_names())
