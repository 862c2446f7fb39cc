"""One DuckDB connection kept from one use to the next, per process, for one store.

A live collector plans, builds and scores every second on the same store. A new in-memory connection with its
views costs 25-60 ms of CPU; bringing a kept one's views to the store as it is costs ~2-3 ms. A ``Kept`` holds
the connection of the last use (one per process, for the store of that use). Whoever takes it holds it alone: a
second user meanwhile (another store, another thread) gets a new connection, closed after. A use that fails
closes the kept one, and so does ``drop`` (for a use that read so much that DuckDB's buffers should go). A
parent's connection, inherited through a fork, is forgotten, never closed or used.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import duckdb

logger = logging.getLogger(__name__)

Connection = duckdb.DuckDBPyConnection


class Kept:
    """The kept connection of one kind of use (``what`` names it in the log): ``make(data)`` connects,
    ``refresh(con, data)`` brings a kept connection's views to the store as it is now."""

    def __init__(self, what: str, make: Callable[[Path], Connection],
                 refresh: Callable[[Connection, Path], object]) -> None:
        self.what = what
        self._make = make
        self._refresh = refresh
        self._lock = threading.Lock()
        self.current: tuple[int, Path, Connection] | None = None
        """(process id, store, connection) of the kept connection, None when there is none."""

    @contextmanager
    def use(self, data: Path) -> Iterator[Connection]:
        """The kept connection on ``data`` when no one else has it (kept after the block unless it failed or
        ``drop`` closed it), else a new one closed after the block."""
        if not self._lock.acquire(blocking=False):
            with closing(self._make(data)) as con:
                yield con
            return
        try:
            con = self._take(data)
            try:
                yield con
            except BaseException:
                self.drop(con)
                raise
        finally:
            self._lock.release()

    def drop(self, con: Connection) -> None:
        """Close ``con``, and forget it when it is the kept one."""
        if self.current is not None and self.current[2] is con:
            self.current = None
        try:
            con.close()
        except duckdb.Error:
            logger.debug("closing the %s connection failed", self.what, exc_info=True)

    def _take(self, data: Path) -> Connection:
        """The kept connection on ``data`` (lock held), refreshed; a new one kept instead when there is none for
        ``data`` in this process or the refresh failed."""
        kept = self.current
        if kept is not None and kept[:2] == (os.getpid(), data):
            try:
                self._refresh(kept[2], data)
                return kept[2]
            except (duckdb.Error, OSError):
                logger.warning("the kept %s connection failed; connecting again", self.what, exc_info=True)
                self.drop(kept[2])
        elif kept is not None and kept[0] == os.getpid():
            self.drop(kept[2])
        self.current = None
        con = self._make(data)
        self.current = (os.getpid(), data, con)
        return con
