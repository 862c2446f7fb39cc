"""The DuckDB connection a live round's build plans on, kept from one round to the next.

A new in-memory connection with the raw view the plan reads (``traces_all``) costs ~25 ms of CPU; a live round
plans every second on the same store. The connection of the last incremental plan is kept (one per process, for
one store) and its view made again on the files now (~2 ms: a local store's view globs its directory when a query
is planned, so the statement only changes when the table gets its first files, or in an object store). Whoever
takes it holds it alone: a second build meanwhile (another store, another thread) connects as before. A plan that
read every spans file, or a build that failed, closes it: DuckDB keeps the buffers of what it read while open.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import duckdb

from tracedag.pipeline.store.views import connect, create_raw_views

logger = logging.getLogger(__name__)

TABLES = ["traces"]
"""The raw views a plan reads (``build._MERGE_SQL``, ``build._FULL_SQL``: traces_all)."""

_LOCK = threading.Lock()
_kept: tuple[int, Path, duckdb.DuckDBPyConnection] | None = None  # process id, store, connection


@contextmanager
def plan_connection(data: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    """A connection over ``data`` with the raw views of ``TABLES``, progress bar off: the kept one when no other
    build has it (kept after the block unless ``drop`` closed it, or the block failed), else a new one."""
    if not _LOCK.acquire(blocking=False):
        with closing(_new(data)) as con:
            yield con
        return
    try:
        con = _take(data)
        try:
            yield con
        except BaseException:
            drop(con)
            raise
    finally:
        _LOCK.release()


def drop(con: duckdb.DuckDBPyConnection) -> None:
    """Close ``con`` (a plan connection), and forget it when it is the kept one."""
    global _kept
    if _kept is not None and _kept[2] is con:
        _kept = None
    try:
        con.close()
    except duckdb.Error:
        logger.debug("closing a plan connection failed", exc_info=True)


def _take(data: Path) -> duckdb.DuckDBPyConnection:
    """The kept connection on ``data`` (``_LOCK`` held), its views made again; a new one kept instead when there is
    none for ``data`` in this process (a parent's, inherited through a fork, is forgotten, not closed)."""
    global _kept
    if _kept is not None and _kept[:2] == (os.getpid(), data):
        con = _kept[2]
        try:
            create_raw_views(con, data, TABLES)
            con.execute("reset threads")  # a collection reads on it with one thread (store.gc)
            return con
        except (duckdb.Error, OSError):
            logger.warning("the kept plan connection failed; connecting again", exc_info=True)
            drop(con)
    elif _kept is not None and _kept[0] == os.getpid():
        drop(_kept[2])
    _kept = None
    con = _new(data)
    _kept = (os.getpid(), data, con)
    return con


def _new(data: Path) -> duckdb.DuckDBPyConnection:
    con = connect(data, tables=TABLES)  # the plan reads traces_all only: no other view
    con.execute("set enable_progress_bar = false")
    return con
