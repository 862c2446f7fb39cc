"""The data directory layout and atomic Parquet files.

``<data>/``
    ``spool/``             raw OTLP batches, the source of truth (collector)
    ``tables/<table>/``    Parquet files of each table, possibly in hive partitions
    ``state/``             small JSON files that make stages incremental
    ``quarantine/``        corrupt spool segments and Parquet files, kept for inspection

Readers glob ``tables/<table>/**/*.parquet``. Writers write ``<name>.parquet.tmp``, fsync it,
rename it to ``<name>.parquet`` and fsync the directory, so a reader never sees a partial file.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq

from tracedag.pipeline.store.listing import remote_files
from tracedag.schemas.errors import SchemaMismatch
from tracedag.schemas.layout import table_dir
from tracedag.schemas.spans import SCHEMA_KEY

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

TABLES = ("spans", "evaluations", "traces", "dag_nodes", "dag_edges", "step_scores", "human_labels", "validations",
          "root_cause_checks")


class RawWritable(Protocol):
    """A binary stream's ``write``: a buffered file returns every byte's count, a raw one may return fewer."""

    def write(self, data: bytes | memoryview, /) -> int | None: ...


def write_all(out: RawWritable, data: bytes) -> int:
    """Write every byte of ``data`` to ``out``; return how many (``len(data)``).

    ``sys.stdout.buffer`` is the raw file when Python runs unbuffered (``PYTHONUNBUFFERED=1``, ``python -u``: the
    default of many container images), and a raw ``write`` to a pipe may take part of the bytes: when a signal
    interrupts it after some went out (the process stopped and continued by a debugger, a profiler such as
    py-spy, or job control). Its count was ignored, and an answer lost the rest of that piece (a ``POST /api/sql``
    answer of 7.4 MB that was no longer JSON, 5 of 20 while py-spy sampled the server). A buffered stream takes
    all at once: the loop runs once."""
    view = memoryview(data)
    while view:
        n = out.write(view)
        if n is None:  # a non-blocking stream that is full: ours never are
            raise BlockingIOError(f"{len(view)} bytes could not be written")
        view = view[n:]
    return len(data)


def new_file_name(prefix: str = "part") -> str:
    """Return a unique, time-sortable file stem."""
    return f"{prefix}-{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"


def parquet_files(data: Path, table: str) -> list[Path]:
    """Return the complete Parquet files of ``table``, sorted by path.

    In the work directory of an object store, the files other writers published are listed too, as
    paths that do not exist locally (``tracedag.pipeline.store.listing.source_uris`` says where they are).
    """
    root = table_dir(data, table)
    local = sorted(root.rglob("*.parquet")) if root.exists() else []
    published = remote_files(data, table)
    return sorted(local + [p for p, _ in published]) if published else local


def check_schema(path: Path, expected: pa.Schema) -> None:
    """Raise ``SchemaMismatch`` unless the file's ``tracedag.schema`` equals the expected one."""
    want = (expected.metadata or {}).get(SCHEMA_KEY, b"").decode()
    meta = pq.read_schema(path).metadata or {}
    found = meta.get(SCHEMA_KEY)
    if found is None or found.decode() != want:
        raise SchemaMismatch(str(path), want, found.decode() if found else None)


# How often a read is planned again after a swap removed a file it listed, pausing a little longer each time
# (``vanished_pause``): on a busy machine a reader can meet several swaps of a GC in a row.
VANISHED_ATTEMPTS = 8


def vanished_pause(attempt: int) -> None:
    """Wait before planning again after ``attempt`` failed on a vanished file: the swap finishes meanwhile."""
    time.sleep(min(0.01 * attempt * attempt, 0.25))


def file_vanished(error: BaseException) -> bool:
    """Whether a DuckDB error says a file it planned with is gone (a GC or compaction swap removed it).

    A reader lists a table's files when it plans a query and opens them as it goes; a swap that
    lands in between removes some (DuckDB 1.x/2.x: ``Cannot open file "...": No such file or
    directory``). Planned again, the query lists the new files and gives the same rows.
    """
    text = str(error).lower()
    return "no such file" in text or "no files found" in text or "cannot open file" in text


def rerun_if_vanished(read: Callable[[], _T], attempts: int = VANISHED_ATTEMPTS) -> _T:
    """``read()``, run again on a fresh plan when a file it planned with was removed by a swap meanwhile.

    A GC or compaction swap replaces a table's files at once, under the build lock only: a reader that
    listed the old files just before (a scorer beside a compacting build, a server) finds one gone
    ("Cannot open file ... No such file"). Planned again, it lists the new files, which hold the same live
    rows. ``read`` must be safe to run again; the last attempt's error is raised as it is.
    """
    for attempt in range(1, attempts + 1):
        try:
            return read()
        except Exception as e:
            if attempt == attempts or not file_vanished(e):
                raise
            logger.info("a file vanished under compaction, re-running: %s", str(e).strip().splitlines()[0])
            vanished_pause(attempt)
    raise AssertionError("unreachable")


def keep_newest(data: Path, path: Path, text: str) -> bool:
    """Keep ``text`` as ``path``, a reader's cache under ``<data>/state/`` (written atomically), and remove the
    older files of its directory with the same suffix: only the newest answer is kept. A path with no store
    (no ``tables/``) or a store this process may not write to (a read-only mount) keeps nothing."""
    if not (data / "tables").is_dir():  # nothing stored there (a mistyped path): make no directory
        return False
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
        for old in path.parent.glob(f"*{path.suffix}"):
            if old != path:
                old.unlink(missing_ok=True)
    except OSError as e:
        logger.info("%s not kept on disk: %s", path.parent.name, e)
        return False
    return True
