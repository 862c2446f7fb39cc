"""Compaction: merge the small Parquet files of a receive-hour partition into a few large ones.

The new state of a partition is built in ``<data>/state/compact/<table>/recv_hour=H/``: small
files merged (streamed, one input file in memory at a time) into files of at most
``target_rows`` rows, large files hard-linked unchanged, spans de-duplicated on their dedupe
keys (first file in write order wins). Then the staging directory and the partition directory
are swapped with one ``renameat2(RENAME_EXCHANGE)``: a reader listing the partition sees either
every old file or every new file, never both and never neither. The old files, now in the
staging path, are deleted. A crash at any point leaves the partition complete (old or new);
leftover staging directories are removed on the next run.

The merge runs beside the converters; files they add meanwhile are linked into the new state
inside the ingest writer lock, just before the swap. A query that listed the old files just before the swap and opens them
after it gets "file not found" and should be re-run (see docs/pages/collector.md, "Data layout").
"""

from __future__ import annotations

import calendar
import ctypes
import errno
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tracedag.collector import faults
from tracedag.pipeline.store.dedupe import DedupeIndex, read_sidecar, sidecar_path, write_sidecar
from tracedag.pipeline.store.parquet import parquet_options
from tracedag.schemas.fsio import file_lock, fsync_dir
from tracedag.schemas.layout import COMPACT_LOCK, MERGED_FROM_KEY, compact_staging_dir, state_file, table_dir

logger = logging.getLogger(__name__)

GROUP_ROWS = 4096
"""Rows buffered per row group of a compacted file (the converters' row groups are 4096-span
chunks). Measured on 51k agent spans: merge memory +46 MB at 2048 rows, +61 MB at 8192, +73 MB at
16,384, +143 MB at 65,536, with the same file size and the same DuckDB scan and point-lookup
times (25-40 ms) at every size up to 16,384. Writing each converter row group alone saved no
memory on a 104-file hour and cost 50 % more CPU."""

MERGE_RUN_CAP = 131_072
"""Largest sorted run of a merge's key index (bounds the memory a merge of two runs needs)."""

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


@dataclass
class CompactStats:
    """What one compaction pass did."""

    partitions: int = 0
    files_before: int = 0
    files_after: int = 0
    duplicates: int = 0


def exchange(a: Path, b: Path) -> None:
    """Atomically swap two directory entries (Linux ``renameat2(RENAME_EXCHANGE)``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    rc = libc.renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(a))


def hour_closed(hour: str, now_unix: float, grace_seconds: float = 300.0) -> bool:
    """Return whether receive hour ``YYYY-MM-DD-HH`` ended more than ``grace_seconds`` ago."""
    start = calendar.timegm(time.strptime(hour, "%Y-%m-%d-%H"))
    return start + 3600 + grace_seconds <= now_unix


class Compactor:
    """Decides which partitions to compact and rebuilds them.

    The merge runs without blocking the converters; only the final step (linking files that
    arrived meanwhile into the new state, then the swap) runs inside ``critical()``, the ingest
    writer lock, so it takes milliseconds. One compactor runs at a time (``state/compact.lock``).
    """

    def __init__(self, data: Path, target_rows: int = 250_000, max_open_files: int = 64) -> None:
        self.data = data
        self.target_rows = target_rows
        self.max_open_files = max_open_files
        self.staging_root = compact_staging_dir(data)
        self._clean: dict[Path, tuple[int, bool, int, int]] = {}  # partition -> state when not due

    def cleanup(self) -> None:
        """Remove staging directories left by a crash (the partitions themselves are complete)."""
        with file_lock(state_file(self.data, COMPACT_LOCK)):
            self._cleanup()

    def _cleanup(self) -> None:
        if self.staging_root.exists():
            shutil.rmtree(self.staging_root)

    def due(self, table: str, now_unix: float) -> list[Path]:
        """Return partitions of ``table`` worth compacting now."""
        root = table_dir(self.data, table)
        if not root.exists():
            return []
        out = []
        for part in sorted(p for p in root.glob("recv_hour=*") if p.is_dir()):
            closed = hour_closed(part.name.split("=", 1)[1], now_unix)
            state = (part.stat().st_mtime_ns, closed, self.max_open_files, self.target_rows)
            if self._clean.get(part) == state:
                continue  # unchanged since it was last found not due
            files = list(part.glob("*.parquet"))
            if len(files) > self.max_open_files or (closed and len(files) > 1 and len(self._small(files)) > 1):
                out.append(part)
            else:
                self._clean[part] = state
        return out

    def _small(self, files: list[Path]) -> list[Path]:
        return [f for f in files if pq.ParquetFile(f).metadata.num_rows < self.target_rows // 2]

    def run(
        self, critical: Callable[[], AbstractContextManager[object]], now_unix: float | None = None,
        prepare: Callable[[], None] | None = None,
    ) -> CompactStats:
        """Compact every partition that is due, spans and evaluations; return what was done.

        ``prepare`` runs once before the first merge, only when some partition is due.
        """
        now = time.time() if now_unix is None else now_unix
        stats = CompactStats()
        with file_lock(state_file(self.data, COMPACT_LOCK)):
            self._cleanup()
            work = [(table, part) for table in ("spans", "evaluations") for part in self.due(table, now)]
            if work and prepare is not None:
                prepare()
            for table, part in work:
                try:
                    self.compact(part, table == "spans", stats, critical)
                except OSError as exc:
                    logger.warning("compaction of %s skipped: %s", part, exc)
                    self._cleanup()
                    if exc.errno in (errno.EINVAL, errno.ENOSYS, errno.EPERM):
                        return stats
        return stats

    def compact(
        self, part: Path, dedupe: bool, stats: CompactStats, critical: Callable[[], AbstractContextManager[object]]
    ) -> None:
        """Rebuild one partition with its small files merged, then swap it in atomically."""
        files = sorted(part.glob("*.parquet"), key=lambda f: f.name)
        small = set(self._small(files))
        stage = self.staging_root / part.parent.name / part.name
        stage.mkdir(parents=True)
        merger = _Merger(stage, self.target_rows, dedupe, merged_from=sorted(f.name for f in small))
        for f in files:
            if f in small:
                merger.add(f)
            else:
                _link(f, stage, dedupe)
        merger.close()
        with critical():
            for f in set(part.glob("*.parquet")) - set(files):  # written while we merged
                _link(f, stage, dedupe)
            fsync_dir(stage)
            faults.hit("compact.middle")
            exchange(stage, part)
            fsync_dir(part.parent)
            fsync_dir(stage.parent)
        shutil.rmtree(stage)
        after = len(list(part.glob("*.parquet")))
        stats.partitions += 1
        stats.files_before += len(files)
        stats.files_after += after
        stats.duplicates += merger.duplicates
        logger.info("compacted %s: %d -> %d files", part, len(files), after)


def _link(f: Path, stage: Path, dedupe: bool) -> None:
    """Hard-link an unchanged file (and its key sidecar) into the new state of its partition."""
    os.link(f, stage / f.name)
    if dedupe and sidecar_path(f).exists():
        os.link(sidecar_path(f), sidecar_path(stage / f.name))


class _Merger:
    """Streams small files into merged files of at most ``target_rows`` rows.

    Input is read one row group at a time (a converter writes one per chunk of about 4096 spans)
    and buffered up to ``group_rows`` rows per output row group, so a compaction holds about one
    row group of Arrow data however large the files are; reading whole files, written as 64k-row
    groups, made compaction the largest moment of a converter's memory.
    """

    def __init__(self, out_dir: Path, target_rows: int, dedupe: bool, group_rows: int = GROUP_ROWS,
                 merged_from: list[str] | None = None) -> None:
        self.out_dir = out_dir
        # in every merged file's footer: a build plan that saw all of them knows the file brings nothing new
        self.merged_from = json.dumps(merged_from or []).encode()
        self.target_rows = target_rows
        self.group_rows = group_rows
        self.dedupe = dedupe
        self.seen = DedupeIndex(max_keys=1 << 62, run_cap=MERGE_RUN_CAP)  # keys already merged (never forgets)
        self.duplicates = 0
        self._writer: pq.ParquetWriter | None = None
        self._path: Path | None = None
        self._rows = 0
        self._keys: list[np.ndarray] = []
        self._content: list[np.ndarray] = []
        self._pending: list[tuple[pa.Table, np.ndarray, np.ndarray]] = []  # with their keys and content
        self._pending_rows = 0
        self._count = 0

    def add(self, f: Path) -> None:
        """Append the rows of ``f`` (minus spans already merged) to the current output file."""
        pf = pq.ParquetFile(f)
        keys, content = read_sidecar(f) if self.dedupe else (np.zeros(0, np.uint64), np.zeros(0, np.uint64))
        start = 0
        for g in range(pf.num_row_groups):
            table = pf.read_row_group(g)
            k, c = keys[start : start + table.num_rows], content[start : start + table.num_rows]
            start += table.num_rows
            if self.dedupe:
                keep = self.seen.check(k, c).keep
                self.seen.add("merged", k[keep], c[keep])
                self.duplicates += int(len(k) - keep.sum())
                if not keep.all():
                    table, k, c = table.filter(pa.array(keep)), k[keep], c[keep]
            if table.num_rows:
                self._buffer(table, k, c)

    def _buffer(self, table: pa.Table, keys: np.ndarray, content: np.ndarray) -> None:
        """Collect row groups until an output row group is full, then write it."""
        self._pending.append((table, keys, content))
        self._pending_rows += table.num_rows
        if self._pending_rows >= self.group_rows:
            self._flush_pending()

    def _flush_pending(self) -> None:
        if not self._pending:
            return
        tables, keys, content = zip(*self._pending, strict=True)
        self._pending, self._pending_rows = [], 0
        self._write(pa.concat_tables(tables) if len(tables) > 1 else tables[0])
        self._keys.extend(keys)  # after ``_write``: they belong to the file just written to
        self._content.extend(content)

    def _write(self, table: pa.Table) -> None:
        if self._writer is None or self._rows >= self.target_rows:
            self._finish_file()
            self._path = self.out_dir / f"compact-{time.time_ns():020d}-{self._count:04d}.parquet"
            self._count += 1
            schema = table.schema.with_metadata({**(table.schema.metadata or {}), MERGED_FROM_KEY: self.merged_from})
            self._writer = pq.ParquetWriter(self._path, schema, **parquet_options(table))
        self._writer.write_table(table, row_group_size=self.group_rows * 2)
        self._rows += table.num_rows

    def _finish_file(self) -> None:
        if self._writer is None or self._path is None:
            return
        self._writer.close()
        with open(self._path, "rb") as fh:
            os.fsync(fh.fileno())
        if self.dedupe:
            write_sidecar(self._path, np.concatenate(self._keys), np.concatenate(self._content))
        self._writer, self._rows, self._keys, self._content = None, 0, [], []

    def close(self) -> None:
        """Finish the last output file."""
        self._flush_pending()
        self._finish_file()
