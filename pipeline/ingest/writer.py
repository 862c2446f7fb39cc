"""The spans writer: de-duplicated commits of converted batches into ``spans`` and ``evaluations``.

One writer at a time per data directory holds the commit lock (``state/ingest.lock``): rows whose
``(trace_id, span_id)`` is already stored are dropped (first write wins, see ``store.dedupe``),
the rest is written one file per receive hour (``recv_hour=YYYY-MM-DD-HH``) with its dedupe
sidecar, and the file generation is bumped so the other writers refresh their index.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tracedag.collector import faults
from tracedag.pipeline.convert.converted import Converted
from tracedag.pipeline.ingest.stage import Staged
from tracedag.pipeline.normalize.evaluations import extract_evaluations
from tracedag.pipeline.store.dedupe import DEFAULT_MAX_KEYS, DedupeIndex, write_sidecar
from tracedag.pipeline.store.parquet import write_atomic, write_atomic_stream
from tracedag.schemas.fsio import fsync_dir, lock_fd, open_lock_file
from tracedag.schemas.layout import (
    INGEST_LOCK,
    spans_epoch_file,
    spans_generation_file,
    state_dir,
    state_file,
    table_dir,
)

logger = logging.getLogger(__name__)

HOUR_NS = 3_600_000_000_000

BEFORE_RENAME = "convert.before_rename"
"""Fault point (crash tests): a converter's Parquet file is written but not yet renamed."""


def hour_of(received_unix_nano: int) -> str:
    """Return the receive-hour partition value ``YYYY-MM-DD-HH`` (UTC) of a receive time."""
    return time.strftime("%Y-%m-%d-%H", time.gmtime(received_unix_nano // 1_000_000_000))


@dataclass
class ConvertStats:
    """Counters of one conversion round (or, summed, of a converter's life)."""

    segments: int = 0
    records: int = 0
    spans_read: int = 0
    spans_stored: int = 0
    duplicates: int = 0
    conflicts: int = 0
    files_written: int = 0
    evaluations: int = 0
    torn_tails: int = 0
    corrupt_records: int = 0
    quarantined: int = 0
    write_errors: int = 0
    failed_segments: int = 0

    def add(self, other: ConvertStats) -> None:
        """Add ``other``'s counters to these."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


_METRIC_HELP = {
    "spans_stored": "Spans written to Parquet by the spool converter.",
    "duplicates": "Spans dropped as duplicates of a stored (trace_id, span_id).",
    "conflicts": "Duplicates whose content differed from the stored span (first write won).",
    "segments": "Spool segments converted.",
    "torn_tails": "Sealed spool segments that ended in a torn record (discarded).",
    "corrupt_records": "Corrupt spool records skipped.",
    "quarantined": "Spool segments moved to quarantine/.",
    "write_errors": "Conversion rounds stopped by a write error (disk full); retried later.",
    "files_written": "Parquet spans files written by the converter.",
    "failed_segments": "Spool segments moved to spool/failed/ after repeated conversion errors.",
}


def publish(stats: ConvertStats) -> None:
    """Add a round's counters to the process metrics registry (``GET /metrics``)."""
    from tracedag.collector.metrics import REGISTRY

    for name, help_text in _METRIC_HELP.items():
        value = getattr(stats, name)
        counter = REGISTRY.counter(f"tracedag_ingest_{name}_total", help_text)
        if value:
            counter.inc(value)


class StoreWriter:
    """Writes converted batches into the spans/evaluations tables; one writer at a time per data dir."""

    def __init__(self, data: Path, window_hours: int = 48, max_keys: int = DEFAULT_MAX_KEYS) -> None:
        self.data = data
        self.index = DedupeIndex(window_hours, max_keys)
        self._generation = ""
        self._epoch = ""
        self._loaded: set[Path] = set()
        state_dir(data).mkdir(parents=True, exist_ok=True)
        self._lock_path = state_file(data, INGEST_LOCK)
        self._gen_path = spans_generation_file(data)
        self._epoch_path = spans_epoch_file(data)

    def store_parts(self, parts: list[Converted], stem: str, stats: ConvertStats) -> None:
        """De-duplicate a batch converted in parts and commit its new rows, one file per receive hour,
        under the lock; one receive hour is written part by part.

        ``parts`` is emptied as the parts are written, so each part's memory is freed early.
        """
        with self.locked():
            kept = self._dedupe(parts, stem, stats)
            parts.clear()
            hours = {h for p in kept for h, _ in _hour_groups(p.table)}
            if len(hours) == 1:
                self._commit_stream(hours.pop(), kept, stem, stats)
            elif kept:
                table = pa.concat_tables([p.table for p in kept]).unify_dictionaries()
                keys, content = np.concatenate([p.keys for p in kept]), np.concatenate([p.content for p in kept])
                kept.clear()
                for hour, idx in _hour_groups(table):
                    self._commit_hour(hour, table.take(idx), keys[idx], content[idx], stem, stats)
            self.bump()

    def _dedupe(self, parts: list[Converted], stem: str, stats: ConvertStats) -> list[Converted]:
        """Return the parts without the rows already stored or repeated (empty parts dropped)."""
        keys = np.concatenate([p.keys for p in parts]) if parts else np.zeros(0, dtype=np.uint64)
        res = self.index.check(keys, np.concatenate([p.content for p in parts]) if parts else keys)
        stats.duplicates += res.duplicates
        stats.conflicts += res.conflicts
        if res.duplicates:
            logger.info("%s: dropped %d duplicate spans (%d conflicts)", stem, res.duplicates, res.conflicts)
        out, start = [], 0
        for p in parts:
            keep = res.keep[start : start + len(p.keys)]
            start += len(p.keys)
            if keep.all():
                out.append(p)
            elif keep.any():
                out.append(Converted(p.table.filter(pa.array(keep)), p.keys[keep], p.content[keep]))
        return out

    def _commit_stream(self, hour: str, parts: list[Converted], stem: str, stats: ConvertStats) -> None:
        """Write one hour's parts as one file, one row group each."""
        evals = [e for e in (extract_evaluations(p.table) for p in parts) if e.num_rows]
        if evals:
            table = pa.concat_tables(evals)
            write_atomic(table, table_dir(self.data, "evaluations") / f"recv_hour={hour}" / f"{stem}.parquet",
                         fault_point=BEFORE_RENAME)
            stats.evaluations += table.num_rows
        keys: list[np.ndarray] = []
        contents: list[np.ndarray] = []

        def tables() -> Iterator[pa.Table]:
            while parts:
                p = parts.pop(0)
                keys.append(p.keys)
                contents.append(p.content)
                stats.spans_stored += p.table.num_rows
                yield p.table

        schema = parts[0].table.schema
        path = write_atomic_stream(tables(), schema,
                                   table_dir(self.data, "spans") / f"recv_hour={hour}" / f"{stem}.parquet",
                                   fault_point=BEFORE_RENAME)
        k, c = np.concatenate(keys), np.concatenate(contents)
        write_sidecar(path, k, c)
        self._loaded.add(path)
        self.index.add(hour, k, c)
        stats.files_written += 1

    def commit_staged(self, staged: Staged, hour: str, stem: str, stats: ConvertStats) -> None:
        """De-duplicate a staged segment and move its file into ``hour`` (rewritten if rows were dropped)."""
        with self.locked():
            res = self.index.check(staged.keys, staged.content)
            stats.duplicates += res.duplicates
            stats.conflicts += res.conflicts
            if res.keep.all() and staged.rows:
                self._rename_staged(staged, hour, stem, stats)
            elif res.keep.any():
                logger.info("%s: dropped %d duplicate spans (%d conflicts)", stem, res.duplicates, res.conflicts)
                table = pq.read_table(staged.path).filter(pa.array(res.keep))
                self._commit_hour(hour, table, staged.keys[res.keep], staged.content[res.keep], stem, stats)
            staged.discard()
            self.bump()

    def _rename_staged(self, staged: Staged, hour: str, stem: str, stats: ConvertStats) -> None:
        if staged.evaluations is not None:
            write_atomic(staged.evaluations,
                         table_dir(self.data, "evaluations") / f"recv_hour={hour}" / f"{stem}.parquet",
                         fault_point=BEFORE_RENAME)
            stats.evaluations += staged.evaluations.num_rows
        final = table_dir(self.data, "spans") / f"recv_hour={hour}" / f"{stem}.parquet"
        final.parent.mkdir(parents=True, exist_ok=True)
        faults.hit(BEFORE_RENAME)
        os.replace(staged.path, final)
        fsync_dir(final.parent)
        write_sidecar(final, staged.keys, staged.content)
        self._loaded.add(final)
        self.index.add(hour, staged.keys, staged.content)
        stats.spans_stored += staged.rows
        stats.files_written += 1

    def _commit_hour(
        self, hour: str, table: pa.Table, keys: np.ndarray, content: np.ndarray, stem: str, stats: ConvertStats
    ) -> None:
        evals = extract_evaluations(table)
        if evals.num_rows:
            write_atomic(evals, table_dir(self.data, "evaluations") / f"recv_hour={hour}" / f"{stem}.parquet",
                         fault_point=BEFORE_RENAME)
            stats.evaluations += evals.num_rows
        path = write_atomic(table, table_dir(self.data, "spans") / f"recv_hour={hour}" / f"{stem}.parquet",
                            fault_point=BEFORE_RENAME)
        write_sidecar(path, keys, content)
        self._loaded.add(path)
        self.index.add(hour, keys, content)
        stats.spans_stored += table.num_rows
        stats.files_written += 1

    def drop_index(self) -> None:
        """Free the dedupe index; the next commit reloads it from the stored files' sidecars."""
        self.index = DedupeIndex(self.index.window_hours, self.index.max_keys)
        self._generation = ""
        self._loaded = set()

    def has_index(self) -> bool:
        """Whether the dedupe index has been loaded (by a first commit)."""
        return bool(self._generation)

    def locked(self) -> _Lock:
        """Return a context manager holding the data dir's writer lock (index refreshed on entry)."""
        return _Lock(self)

    def refresh(self) -> None:
        """Bring the dedupe index up to date after another writer (or a compaction) changed the files.

        Files added by other writers are indexed incrementally (their sidecars only); a compaction
        (which renames files) bumps the epoch and makes the index reload from scratch.
        """
        gen = _read_text(self._gen_path)
        epoch = _read_text(self._epoch_path)
        if epoch != self._epoch or not self._generation:
            self.index = DedupeIndex(self.index.window_hours, self.index.max_keys)
            self._loaded = set(self.index.load_dir(table_dir(self.data, "spans")))
            self._epoch = epoch
            self._generation = gen or self.bump()
        elif gen != self._generation:
            self._loaded.update(self.index.load_new(table_dir(self.data, "spans"), self._loaded))
            self._generation = gen

    def bump_epoch(self) -> None:
        """Record that stored files were replaced (a compaction swap): writers rebuild their index."""
        tmp = self._epoch_path.with_name(self._epoch_path.name + ".tmp")
        tmp.write_text(f"{os.getpid()}-{time.time_ns()}")
        os.replace(tmp, self._epoch_path)
        self.bump()

    def bump(self) -> str:
        """Record that the stored files changed (other writers reload their dedupe index)."""
        gen = f"{os.getpid()}-{time.time_ns()}"
        tmp = self._gen_path.with_name(self._gen_path.name + ".tmp")
        tmp.write_text(gen)
        os.replace(tmp, self._gen_path)
        self._generation = gen
        return gen


def _read_text(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


class _Lock:
    """``flock`` on ``state/ingest.lock``; refreshes the writer's index once held."""

    def __init__(self, writer: StoreWriter) -> None:
        self.writer = writer
        self.fd = -1

    def __enter__(self) -> _Lock:
        self.fd = open_lock_file(self.writer._lock_path)
        lock_fd(self.fd)
        self.writer.refresh()
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)  # closing the descriptor releases the lock


def _hour_groups(table: pa.Table) -> Iterator[tuple[str, np.ndarray]]:
    """Yield (receive hour, row indices) of ``table``."""
    recv = table.column("received_unix_nano").to_numpy()
    hours = recv // HOUR_NS
    for h in np.unique(hours):
        yield hour_of(int(h) * HOUR_NS), np.nonzero(hours == h)[0]
