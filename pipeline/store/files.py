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

import fcntl
import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tracedag.schemas.errors import SchemaMismatch
from tracedag.schemas.fsio import fsync_dir as fsync_dir
from tracedag.schemas.spans import SCHEMA_KEY

TABLES = ("spans", "evaluations", "traces", "dag_nodes", "dag_edges", "step_scores", "human_labels")


def table_dir(data: Path, table: str) -> Path:
    """Return ``<data>/tables/<table>``."""
    return data / "tables" / table


def new_file_name(prefix: str = "part") -> str:
    """Return a unique, time-sortable file stem."""
    return f"{prefix}-{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"


def write_parquet_atomic(
    table: pa.Table, directory: Path, stem: str | None = None, row_group_size: int = 64 * 1024
) -> Path:
    """Write ``table`` as ``directory/<stem>.parquet`` atomically (tmp, fsync, rename, dir fsync)."""
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"{stem or new_file_name()}.parquet"
    tmp = final.with_name(final.name + ".tmp")
    with open(tmp, "wb") as fh:
        pq.write_table(table, fh, compression="zstd", row_group_size=row_group_size)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, final)
    fsync_dir(directory)
    return final


def parquet_files(data: Path, table: str) -> list[Path]:
    """Return the complete Parquet files of ``table``, sorted by path."""
    root = table_dir(data, table)
    if not root.exists():
        return []
    return sorted(root.rglob("*.parquet"))


def check_schema(path: Path, expected: pa.Schema) -> None:
    """Raise ``SchemaMismatch`` unless the file's ``tracedag.schema`` equals the expected one."""
    want = (expected.metadata or {}).get(SCHEMA_KEY, b"").decode()
    meta = pq.read_schema(path).metadata or {}
    found = meta.get(SCHEMA_KEY)
    if found is None or found.decode() != want:
        raise SchemaMismatch(str(path), want, found.decode() if found else None)


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing) for the ``with`` block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
