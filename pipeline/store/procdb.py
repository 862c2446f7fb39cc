"""The in-memory DuckDB database a process's store connections share, each in a catalog of its own.

A new in-memory DuckDB database costs 12-23 ms of CPU before it runs anything (its catalog of built-in functions is
made per database), and ``views.connect`` used to open one for every connection: a ``tracedag query`` process, a
poll, a score round, each opened several. Here a process opens one database, and each connection is a cursor of it
(its own connection: session settings, variables, temporary tables and registered Arrow tables stay its own) that
``USE``s an in-memory catalog attached for it alone, so the views and macros it makes are its own too: two
connections over two stores in one process never see each other's ``spans``. A cursor, an ``ATTACH`` and a ``USE``
cost ~0.5 ms.

What a connection here shares with the others of its process is the database's global settings (``threads``,
``memory_limit``, ``temp_directory``, ``parquet_metadata_cache``, ...) and its registered filesystems: a caller that
sets one of these asks ``views.connect(..., private=True)`` for a database of its own, as before.

Some catalogs are common to every connection of the process (``common_catalog``): the shared query macros, made once
per process and put on a connection's search path after its own catalog (``views.create_views``).

The views of a store are shared the same way (``view_set``): the connections whose views are made by the same
statements (a local store's views glob its table directories, so its statements change only when a table gets its
first files or a derived table appears) read them from one catalog on their search path, made by the first of them
(binding ~20 views cost ~16 ms of CPU per connection). A view binds in its own catalog first, so the shared
``dag_nodes`` reads the shared ``traces`` even when a connection's own catalog has a ``traces`` of its own: a
caller that replaces refined views makes the others its own first (``views.forget_views``), and the connection's
next ``create_views``/``refresh_views`` drops what its own catalog holds over the set. The newest ``KEPT_SETS``
sets stay; an older one is detached once no connection reads it.

A catalog goes when its connection is gone: the next connection made in the process detaches the catalogs of the
connections garbage-collected since (a closed one that its caller still holds stays until it is collected).

The database is closed when the process exits (``atexit``), before the interpreter finalizes: a DuckDB connection
destroyed during finalization releases the GIL in its destructor and may never get it back, and the process then
aborts after its work is done (``terminate called without an active exception``, exit status 134; DuckDB issue
#13904). A ``tracedag build`` of the demo's simulated users once ended so under a loaded suite. Closing the root
connection closes every cursor made from it; ``close_at_exit`` adds a database of another kind (a private one a
caller keeps for the process's life, as serve does).
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable

import duckdb

OWN = "database_name = current_database()"
"""A filter of ``duckdb_views()``/``duckdb_functions()`` to a connection's own catalog (not the other connections')."""

VISIBLE = (f"({OWN} or list_contains(string_split(current_setting('search_path'), ','), "
           "database_name || '.' || schema_name))")
"""A filter of ``duckdb_views()``/``duckdb_functions()`` to what a connection sees: its own catalog's and those on its
search path (the shared macros' catalog), not the other connections' catalogs."""

SEEN = (f"({OWN} or (starts_with(database_name, 'tracedag_views_') and list_contains(string_split("
        "current_setting('search_path'), ','), database_name || '.' || schema_name)))")
"""A filter of ``duckdb_views()`` to the views a connection reads: its own catalog's and its view set's (``view_set``),
not the shared macros' catalog (whose views are over an empty store) nor the other connections'. A view of the
connection's own catalog shadows its view set's view of the same name."""

KEPT_SETS = 8
"""View sets (``view_set``) kept for the next connections; an older one goes once no connection reads it."""

_LOCK = threading.Lock()
_ROOT: dict[int, duckdb.DuckDBPyConnection] = {}  # process id -> its database (a forked child opens its own)
_CATALOGS: list[tuple[weakref.ref[duckdb.DuckDBPyConnection], str]] = []  # each connection's catalog, its name
_OWN: weakref.WeakKeyDictionary[duckdb.DuckDBPyConnection, str] = weakref.WeakKeyDictionary()  # connection -> catalog
_COMMON: dict[str, str] = {}  # what a common catalog holds -> its name, in this process's database
_SETS: OrderedDict[str, str] = OrderedDict()  # the statements of a view set -> its catalog (the newest last)
_RETIRED: list[str] = []  # catalogs of view sets pushed out of _SETS, detached once no connection reads them
_READS: weakref.WeakKeyDictionary[duckdb.DuckDBPyConnection, str] = weakref.WeakKeyDictionary()  # con -> its set
_MAKING = threading.Lock()
_NAMES = itertools.count()
_AT_EXIT: dict[int, weakref.WeakSet[duckdb.DuckDBPyConnection]] = {}  # process id -> connections closed at its exit
logger = logging.getLogger(__name__)


def connection() -> duckdb.DuckDBPyConnection:
    """A new connection to this process's database, using an empty in-memory catalog of its own."""
    with _LOCK:
        root = _root()
        _detach_gone(root)
        name = f"tracedag_conn_{os.getpid()}_{next(_NAMES)}"
        root.execute(f"attach ':memory:' as {name}")
        con = root.cursor()
        _CATALOGS.append((weakref.ref(con), name))
        _OWN[con] = name
    con.execute(f"use {name}")
    return con


def cursor() -> duckdb.DuckDBPyConnection:
    """A plain connection to this process's database (its default catalog, nothing attached for it): for work that
    keeps to temporary tables and registered Arrow tables (``dag.duck``'s reconstructions)."""
    with _LOCK:
        return _root().cursor()


def catalog_of(con: duckdb.DuckDBPyConnection) -> str | None:
    """The catalog of ``con`` when it is one of this process's database's connections (``connection``), else None."""
    with _LOCK:
        return _OWN.get(con) if os.getpid() in _ROOT else None


def common_catalog(what: str, make: Callable[[duckdb.DuckDBPyConnection], None]) -> str:
    """The name of a catalog of this process's database that every connection may read, made once by ``make`` (given
    a connection using it) the first time ``what`` is asked for; it stays for the process's life."""
    with _MAKING:
        with _LOCK:
            _root()  # a forked child's first: forgets the parent's catalogs
            found = _COMMON.get(what)
        if found is not None:
            return found
        name = _made_catalog(f"tracedag_{what}_{os.getpid()}", make)
        with _LOCK:
            _COMMON[what] = name
        return name


def view_set(con: duckdb.DuckDBPyConnection, statements: str) -> str:
    """The name of the catalog holding the views ``statements`` make, for ``con`` (a connection of this process's
    database) to read through its search path; made by running them in a new catalog the first time they are
    asked for. A failing statement (a file a swap removed) leaves no catalog behind and raises."""
    with _MAKING:
        with _LOCK:
            _root()  # a forked child's first: forgets the parent's catalogs
            name = _SETS.get(statements)
            if name is not None:
                _SETS.move_to_end(statements)
                _READS[con] = name
                return name
        name = _made_catalog(f"tracedag_views_{os.getpid()}_{next(_NAMES)}", lambda cur: cur.execute(statements))
        with _LOCK:
            _SETS[statements] = name
            _READS[con] = name
            while len(_SETS) > KEPT_SETS:
                _RETIRED.append(_SETS.popitem(last=False)[1])
        return name


def view_set_of(con: duckdb.DuckDBPyConnection) -> str | None:
    """The catalog of the view set ``con`` reads (``view_set``), or None (its views are its own, or it has none)."""
    with _LOCK:
        return _READS.get(con)


def _made_catalog(name: str, make: Callable[[duckdb.DuckDBPyConnection], object]) -> str:
    """Attach the in-memory catalog ``name`` and run ``make`` on a cursor using it (under ``_MAKING``); a failing
    ``make`` leaves no catalog behind and raises."""
    with _LOCK:
        root = _root()
        root.execute(f"attach ':memory:' as {name}")
        cur = root.cursor()
    try:
        cur.execute(f"use {name}")
        make(cur)
    except BaseException:
        root.execute(f"detach database if exists {name}")
        raise
    finally:
        cur.close()
    return name


def catalogs() -> int:
    """How many catalogs this process's database holds for its connections now (tests, diagnostics)."""
    with _LOCK:
        return len(_CATALOGS) if os.getpid() in _ROOT else 0


def close_at_exit(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """Close ``con`` (a database of its own that may outlive its caller, and every cursor made from it) when this
    process exits, before the interpreter finalizes; return it. Held weakly: a connection collected before is
    already closed."""
    with _LOCK:
        _closed_at_exit().add(con)
    return con


def _closed_at_exit() -> weakref.WeakSet[duckdb.DuckDBPyConnection]:
    """This process's connections to close at its exit (under ``_LOCK``); a forked child starts a set of its own
    (its parent's connections are not its to close: their threads are not in the child)."""
    pid = os.getpid()
    found = _AT_EXIT.get(pid)
    if found is None:
        _AT_EXIT.clear()
        found = _AT_EXIT[pid] = weakref.WeakSet()
    return found


def _close_all() -> None:
    """At exit: close this process's database (every connection and cursor of it) and the connections given to
    ``close_at_exit``; a later connection in this process opens a new database."""
    with _LOCK:
        pid = os.getpid()
        doomed = list(_AT_EXIT.pop(pid, ()))
        root = _ROOT.pop(pid, None)
    for con in [*doomed, *([root] if root is not None else [])]:
        try:
            con.close()
        except duckdb.Error as e:  # closing must not stop the exit
            logger.debug("connection not closed at exit: %s", e)


atexit.register(_close_all)


def _root() -> duckdb.DuckDBPyConnection:
    pid = os.getpid()
    if pid not in _ROOT:
        _ROOT.clear()  # a parent's, inherited through a fork: never used here (its threads are gone)
        _CATALOGS.clear()
        _COMMON.clear()
        _SETS.clear()
        _RETIRED.clear()
        _READS.clear()
        _ROOT[pid] = duckdb.connect(":memory:")
    return _ROOT[pid]


def _detach_gone(root: duckdb.DuckDBPyConnection) -> None:
    """Detach the catalogs whose connection was garbage-collected, and the retired view sets no connection reads
    (under ``_LOCK``)."""
    kept: list[tuple[weakref.ref[duckdb.DuckDBPyConnection], str]] = []
    for ref, name in _CATALOGS:
        if ref() is None and _detached(root, name):
            continue
        kept.append((ref, name))
    _CATALOGS[:] = kept
    read = set(_READS.values())
    _RETIRED[:] = [name for name in _RETIRED if name in read or not _detached(root, name)]


def _detached(root: duckdb.DuckDBPyConnection, name: str) -> bool:
    """Detach the catalog ``name``; False (tried again by the next connection) when DuckDB refuses."""
    try:
        root.execute(f"detach database if exists {name}")
    except duckdb.Error as e:
        logger.debug("catalog %s not detached yet: %s", name, e)
        return False
    return True


def shared(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether ``con`` is one of the connections of this process's database (``connection``)."""
    return catalog_of(con) is not None
