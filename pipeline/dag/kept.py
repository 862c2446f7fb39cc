"""The DuckDB connection a live round's build plans on, kept from one round to the next (``store.kept``).

A new in-memory connection with the raw view the plan reads (``traces_all``) costs ~25 ms of CPU; a live round
plans every second on the same store. The connection of the last incremental plan is kept (one per process, for
one store) and its view made again on the files now (~2 ms: a local store's view globs its directory when a query
is planned, so the statement only changes when the table gets its first files, or in an object store). A plan that
read every spans file, or a build that failed, closes it: DuckDB keeps the buffers of what it read while open.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from tracedag.pipeline.store.kept import Kept
from tracedag.pipeline.store.views import connect, create_raw_views

TABLES = ["traces"]
"""The raw views a plan reads (``build._MERGE_SQL``, ``build._FULL_SQL``: traces_all)."""


def _new(data: Path) -> duckdb.DuckDBPyConnection:
    con = connect(data, tables=TABLES, private=True)  # traces_all only; a collection sets its threads
    con.execute("set enable_progress_bar = false")
    return con


def _refresh(con: duckdb.DuckDBPyConnection, data: Path) -> None:
    create_raw_views(con, data, TABLES)
    con.execute("reset threads")  # a collection reads on it with one thread (store.gc)


PLAN = Kept("plan", _new, _refresh)
"""``PLAN.use(data)``: a connection over ``data`` with the raw views of ``TABLES``, progress bar off: the kept one
when no other build has it, else a new one; ``PLAN.drop(con)`` closes it."""
