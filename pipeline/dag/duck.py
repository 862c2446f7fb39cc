"""The DuckDB connections of the reconstructions: cursors of one in-memory database per process (``store.procdb``).

A new in-memory database costs about 23 ms of CPU (and 80 ms of wall time on a busy machine) before it runs
anything, mostly its catalog; a cursor of an open one about 1.5 ms. A live round reconstructs every second, so
each reconstruction of up to ``SHARED_MAX_ROWS`` spans takes a cursor instead. What a reconstruction puts on its
cursor stays its own: registered Arrow tables and temporary tables belong to the connection, and go with it when
it is closed. The database itself stays open, and its allocator keeps some of what a reconstruction used (~60 MB
after one of 80k spans, reused by the next): a larger reconstruction, where 23 ms is nothing, gets a database of
its own, whose memory goes when it is closed.
"""

from __future__ import annotations

import duckdb

from tracedag.pipeline.store import procdb

SHARED_MAX_ROWS = 50_000
"""The largest input that a reconstruction runs on the shared database: a live round keeping up (a second of spans
at 10k/s); a larger one (a round behind, a full build's chunks of up to ``build.CHUNK_SPANS``) gets its own."""


def connection(rows: int) -> duckdb.DuckDBPyConnection:
    """A connection for a reconstruction of ``rows`` input rows (``SHARED_MAX_ROWS``), progress bar off; close it."""
    if rows <= SHARED_MAX_ROWS:
        return cursor()
    con = procdb.close_at_exit(duckdb.connect(":memory:"))
    con.execute("set enable_progress_bar = false")
    return con


def cursor() -> duckdb.DuckDBPyConnection:
    """A new connection to this process's in-memory database (``store.procdb``, the one the store's connections
    share), progress bar off; close it when done."""
    con = procdb.cursor()
    con.execute("set enable_progress_bar = false")
    return con
