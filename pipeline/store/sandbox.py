"""Read-only SQL over a store: one SELECT, file access to the store only, a deadline.

``lock_down(con, data)`` turns a connection (views already created) into one that can read the
store's files and nothing else: ``allowed_directories`` = the store, then external access off,
extension auto-install/-load and Python replacement scans off, and the configuration locked
(RELIABILITY.md section 4: the order matters, and a locked configuration cannot be reopened by
the query). ``check_select(sql)`` accepts exactly one statement, of type SELECT (``WITH``,
``FROM``-first, ``DESCRIBE``, ``SUMMARIZE`` included), and no ``~`` path (the home-directory
bypass of the allowlist). ``deadline(con, seconds)`` interrupts a query that runs too long.

This is the defence an operator's own CLI needs; serving SQL to others also needs a separate,
killable process with an OS memory cap (a single expression can outgrow DuckDB's own limits).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb

from tracedag.pipeline.store import procdb
from tracedag.pipeline.store.cachereads import pinned_copies
from tracedag.pipeline.store.remote import remote_of
from tracedag.schemas.errors import QueryFailed

_TILDE = re.compile(r"'~")


def check_select(sql: str, label: str = "--sql") -> None:
    """Raise ``QueryFailed`` unless ``sql`` is exactly one SELECT statement without a ``~`` path."""
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as e:
        raise QueryFailed(label, str(e).strip().splitlines()[0]) from e
    if len(statements) != 1:
        raise QueryFailed(label, f"read-only mode runs exactly one statement, got {len(statements)}")
    if statements[0].type != duckdb.StatementType.SELECT:
        kind = statements[0].type.name
        raise QueryFailed(label, f"read-only mode runs SELECT statements only, not {kind}")
    if _TILDE.search(sql):
        raise QueryFailed(label, "read-only mode refuses '~' paths")


def lock_down(con: duckdb.DuckDBPyConnection, data: Path) -> None:
    """Allow file access to ``data`` only, switch off extensions and replacement scans, lock the settings (of the
    whole database: ``con`` must have one of its own, ``views.connect(..., private=True)``)."""
    if procdb.shared(con):
        raise ValueError("lock_down locks the settings of the whole database: connect with private=True")
    allowed = [str(Path(data).resolve())]
    remote = remote_of(Path(data))
    if remote is not None:  # an object store: its files under the store's prefix, through fsspec
        allowed.append(remote.uri(""))
    listed = ", ".join("'" + a.replace("'", "''") + "'" for a in allowed)
    con.execute(f"set allowed_directories = [{listed}]")
    copies = pinned_copies(con)  # the store's objects its views read from the local object cache
    if copies:
        con.execute("set allowed_paths = [" + ", ".join("'" + c.replace("'", "''") + "'" for c in copies) + "]")
    for setting in ("enable_external_access", "autoinstall_known_extensions", "autoload_known_extensions",
                    "allow_community_extensions", "python_enable_replacements"):
        con.execute(f"set {setting} = false")
    con.execute("set lock_configuration = true")


@contextmanager
def deadline(con: duckdb.DuckDBPyConnection, seconds: float | None, label: str) -> Iterator[None]:
    """Interrupt the query running on ``con`` after ``seconds``; raise ``QueryFailed`` when it was."""
    if seconds is None:
        yield
        return
    fired = threading.Event()

    def interrupt() -> None:
        fired.set()
        con.interrupt()

    timer = threading.Timer(seconds, interrupt)
    timer.daemon = True
    timer.start()
    try:
        yield
    except duckdb.Error as e:
        if fired.is_set():
            raise QueryFailed(label, f"timed out after {seconds:g} s (--timeout)") from e
        raise
    finally:
        timer.cancel()
