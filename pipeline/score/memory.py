"""How much memory DuckDB may take while the named queries' results are stored, and where it spills the rest.

DuckDB's own default is 80 % of the machine's RAM, whatever else runs on it: storing the results of a 10M-span
store in one go was killed by the kernel's OOM killer at 19.7 GB resident on a shared 23 GB machine. The limit
here is a share of the memory available when the connection is made (``MemAvailable`` in ``/proc/meminfo``),
a quarter by default: DuckDB keeps what it is allowed (the parts' copies, its caches), so the limit is about what
the process takes (``bench/score_memory.py``, 2.5M spans in parts of 100k traces: peak RSS 2.5 GB at a 2 GB
limit, 7.5 GB at half of 21 GB available, more than the one round's 4.8 GB; 10M spans: 5.7 GB at 5 GB), and the
process also holds Arrow tables DuckDB does not count. ``TRACEDAG_SCORE_MEMORY`` (or ``tracedag score --memory-limit``)
overrides it with a size (``8GB``, ``512MB``) or another share of the available memory (``30%``). What does
not fit spills to a directory on the store's disk, removed when the connection closes.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import duckdb

from tracedag.pipeline.store import procdb
from tracedag.pipeline.store.views import connect

MEMORY_ENV = "TRACEDAG_SCORE_MEMORY"
DEFAULT_SHARE = 0.25
"""Of the memory available at connect time, when neither the option nor the environment says otherwise."""
FLOOR = 256 * 2**20
"""A limit below this is raised to it: DuckDB cannot plan the named queries in less."""

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(%|[kmgt]i?b|b)?\s*$", re.IGNORECASE)


def mem_available(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """The bytes the kernel says are available (``MemAvailable``), or None where it does not say."""
    try:
        text = meminfo.read_text()
    except OSError:
        return None
    found = re.search(r"^MemAvailable:\s+(\d+)\s*kB", text, re.MULTILINE)
    return None if found is None else int(found.group(1)) * 1024


def parse_memory(text: str, available: int | None) -> int | None:
    """``text`` (``8GB``, ``512MiB``, ``30%`` of ``available``) in bytes; None for a share when the available memory
    is unknown. Raises ValueError with what is accepted when ``text`` is none of these."""
    found = _SIZE.match(text)
    if found is None:
        raise ValueError(f"{text!r} is not a memory size: give e.g. 8GB, 512MB or 30% (of the available memory)")
    number, unit = float(found.group(1)), (found.group(2) or "").lower()
    if unit == "%":
        if not 0 < number <= 100:
            raise ValueError(f"{text!r}: a share of the available memory is more than 0% and at most 100%")
        return None if available is None else max(int(available * number / 100), FLOOR)
    if number <= 0:
        raise ValueError(f"{text!r}: a memory limit must be more than 0")
    return max(int(number * _UNITS[unit]), FLOOR)


def memory_limit(given: str | None = None, env: Mapping[str, str] = os.environ) -> int | None:
    """DuckDB's memory limit in bytes for storing results: ``given``, else ``TRACEDAG_SCORE_MEMORY``, else a quarter
    of the available memory; None when nothing says (DuckDB's default then)."""
    available = mem_available()
    text = given if given is not None else env.get(MEMORY_ENV, "").strip()
    if text:
        try:
            return parse_memory(text, available)
        except ValueError as e:
            source = "--memory-limit" if given is not None else MEMORY_ENV
            raise ValueError(f"{source}: {e}") from None
    return None if available is None else max(int(available * DEFAULT_SHARE), FLOOR)


@contextmanager
def spill_directory(data: Path) -> Iterator[Path]:
    """A directory for DuckDB to spill to in ``data/state``, removed on leaving: close the connection spilling there
    first (leave the connection's context inside this one)."""
    spill = Path(data) / "state" / f"duckdb-spill-{os.getpid()}"
    spill.mkdir(parents=True, exist_ok=True)
    try:
        yield spill
    finally:
        shutil.rmtree(spill, ignore_errors=True)


def _own_database(con: duckdb.DuckDBPyConnection) -> None:
    if procdb.shared(con):
        raise ValueError("a memory limit or spill directory is the whole database's: connect with private=True")


def spill_to(con: duckdb.DuckDBPyConnection, spill: Path) -> None:
    """Make ``con`` spill to ``spill``: before it spilled anywhere (DuckDB cannot switch its directory once used).
    ``con`` has a database of its own (``views.connect(..., private=True)``): the directory is the database's."""
    _own_database(con)
    quoted = str(spill).replace("'", "''")
    con.execute(f"set temp_directory = '{quoted}'")


def bound(con: duckdb.DuckDBPyConnection, limit: int | None) -> None:
    """Set ``con``'s memory ``limit`` (bytes; None: leave it): of its database, which must be its own."""
    _own_database(con)
    if limit is not None:
        con.execute(f"set memory_limit = '{int(limit) // 2**20}MiB'")


@contextmanager
def bounded_connection(data: Path, limit: int | None, shared_macros: bool = True) -> Iterator[duckdb.DuckDBPyConnection]:
    """A connection with every view over ``data`` (``views.connect``, with the shared macros unless ``shared_macros``
    is False), the memory ``limit`` (bytes; None: DuckDB's default) and a spill directory in ``data/state``, removed
    once the connection is closed."""
    with spill_directory(data) as spill:
        con = connect(data, shared_macros=shared_macros, private=True)  # its memory limit and spill directory
        try:
            bound(con, limit)
            spill_to(con, spill)
            yield con
        finally:
            con.close()
