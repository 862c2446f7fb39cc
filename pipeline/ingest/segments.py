"""Spool segments -> ``spans`` and ``evaluations`` Parquet, de-duplicated, partitioned by receive hour.

``SpoolConverter(data).run_once()`` converts every sealed segment (``<data>/spool/*.sealed``):
records are decoded (torn tail discarded, corrupt stretches skipped), converted to ``SPANS_V1``
rows, de-duplicated on ``(trace_id, span_id)`` (first write wins, see ``dedupe``), split by
receive hour and written as ``tables/spans/recv_hour=YYYY-MM-DD-HH/seg-<seq>.parquet`` plus the
matching ``tables/evaluations/...`` file. Only then is the segment moved to ``spool/done/``
(``quarantine/`` when it held corruption). A segment is converted in chunks of about
``CHUNK_SPANS`` spans (bounded memory); each chunk becomes one row group, rows in arrival order
(sorting 4,096 random trace ids buys no row-group pruning). Several converters (``shard=(w, k)``) may run at once: each claims the oldest sealed
segment no other converter holds (an exclusive ``flock`` on the segment, which the kernel drops
if the converter dies), so a converter never idles while another has a backlog; the writer lock
orders their de-duplication and commits.

Crash safety: output names derive from the segment sequence, so re-converting a segment after a
crash rewrites the same names, and the dedupe index (rebuilt from the stored files) drops what
was already committed. Temp files (``*.tmp``) are never read and are removed on start. A failing
write (disk full) leaves the segment in the spool and is retried on the next round; any other
error is retried ``MAX_ATTEMPTS`` times, then the segment moves to ``spool/failed/`` with a
``<segment>.exception`` file beside it, so one bad segment never blocks the spool.

Fault injection for crash tests: ``TRACEDAG_FAULT`` names points where the process calls
``os._exit(137)`` (comma separated): ``convert.before_rename`` (c), ``convert.after_rename`` (d),
``compact.middle`` (e), ``recovery`` (f: during the first round after start); ``enospc`` makes
Parquet writes fail with ENOSPC.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import BinaryIO, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tracedag.collector import faults
from tracedag.collector.spoolfmt import (
    DONE_RETENTION_SECONDS,
    MAGIC,
    SEALED_SUFFIX,
    CorruptRecord,
    Record,
    RecordRef,
    read_payload,
    read_records,
    scan_headers,
    segment_seq,
)
from tracedag.pipeline.convert.converted import Converted
from tracedag.pipeline.convert.pool import convert_parallel
from tracedag.pipeline.convert.records import convert_records
from tracedag.pipeline.ingest.stage import Staged, clean_stage_dir, stage_chunks, stage_dir
from tracedag.pipeline.normalize.evaluations import extract_evaluations
from tracedag.pipeline.store.compact import Compactor, CompactStats, parquet_options
from tracedag.pipeline.store.dedupe import DEFAULT_MAX_KEYS, DedupeIndex, write_sidecar
from tracedag.pipeline.store.files import fsync_dir, table_dir

logger = logging.getLogger(__name__)

ENV_FAULT = "TRACEDAG_FAULT"
"""Comma-separated fault points (crash tests only)."""

MAX_ATTEMPTS = 3
"""Conversion attempts of a segment (other than for a full disk) before it moves to ``spool/failed/``."""

CHUNK_SPANS = 4096
"""Spans converted together. Per CPU-second 4096 converts 1.07x faster than 2048 and 0.95x as fast
as 8192, whose transient memory is ~20 MB larger per converter process (``bench/convert.py``)."""

COMPACT_DEFER_MAX = 10
"""While conversion is behind, compaction waits at most this many compaction intervals."""

HOUR_NS = 3_600_000_000_000

PRUNE_INTERVAL_SECONDS = 10.0
"""How often converter 0 deletes the segments of ``spool/done/`` past their retention."""

_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS}


def fault(point: str) -> None:
    """Exit the process abruptly (as ``kill -9`` would) when ``point`` is listed in ``TRACEDAG_FAULT``."""
    faults.hit(point)


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


def write_atomic(table: pa.Table, final: Path) -> Path:
    """Write ``table`` to ``final`` via ``final.tmp``, fsync, rename, directory fsync."""
    return write_atomic_stream(iter([table]), table.schema, final)


def write_atomic_stream(tables: Iterator[pa.Table], schema: pa.Schema, final: Path) -> Path:
    """Like ``write_atomic`` for tables produced one after another (one row group or more each)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(final.name + ".tmp")
    try:
        if "enospc" in os.environ.get(ENV_FAULT, "").split(","):
            raise OSError(errno.ENOSPC, "No space left on device (injected)", str(tmp))
        with open(tmp, "wb") as fh:
            with pq.ParquetWriter(fh, schema, **parquet_options(schema.empty_table(), fast=True)) as writer:
                for table in tables:
                    writer.write_table(table, row_group_size=64 * 1024)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fault("convert.before_rename")
    os.replace(tmp, final)
    fsync_dir(final.parent)
    return final


class StoreWriter:
    """Writes converted batches into the spans/evaluations tables; one writer at a time per data dir."""

    def __init__(self, data: Path, window_hours: int = 48, max_keys: int = DEFAULT_MAX_KEYS) -> None:
        self.data = data
        self.index = DedupeIndex(window_hours, max_keys)
        self._generation = ""
        self._epoch = ""
        self._loaded: set[Path] = set()
        (data / "state").mkdir(parents=True, exist_ok=True)
        self._lock_path = data / "state" / "ingest.lock"
        self._gen_path = data / "state" / "spans.generation"
        self._epoch_path = data / "state" / "spans.epoch"

    def store(self, conv: Converted, stem: str, stats: ConvertStats) -> None:
        """De-duplicate ``conv`` and commit its new rows, one file per receive hour, under the lock."""
        self.store_parts([conv], stem, stats)

    def store_parts(self, parts: list[Converted], stem: str, stats: ConvertStats) -> None:
        """Like ``store`` for a batch converted in parts; one receive hour is written part by part.

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
            write_atomic(table, table_dir(self.data, "evaluations") / f"recv_hour={hour}" / f"{stem}.parquet")
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
                                   table_dir(self.data, "spans") / f"recv_hour={hour}" / f"{stem}.parquet")
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
                         table_dir(self.data, "evaluations") / f"recv_hour={hour}" / f"{stem}.parquet")
            stats.evaluations += staged.evaluations.num_rows
        final = table_dir(self.data, "spans") / f"recv_hour={hour}" / f"{stem}.parquet"
        final.parent.mkdir(parents=True, exist_ok=True)
        fault("convert.before_rename")
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
            write_atomic(evals, table_dir(self.data, "evaluations") / f"recv_hour={hour}" / f"{stem}.parquet")
            stats.evaluations += evals.num_rows
        path = write_atomic(table, table_dir(self.data, "spans") / f"recv_hour={hour}" / f"{stem}.parquet")
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
        self.fd = os.open(self.writer._lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        self.writer.refresh()
        return self

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def _hour_groups(table: pa.Table) -> Iterator[tuple[str, np.ndarray]]:
    """Yield (receive hour, row indices) of ``table``."""
    recv = table.column("received_unix_nano").to_numpy()
    hours = recv // HOUR_NS
    for h in np.unique(hours):
        yield hour_of(int(h) * HOUR_NS), np.nonzero(hours == h)[0]


def scan_segment(data: bytes) -> tuple[list[Record], str, int]:
    """Return the intact records of a segment, how it ended (clean/torn/corrupt) and corrupt stretches.

    After a corrupt stretch the scan resumes at the next offset where an intact record starts,
    so records after a damaged one are kept.
    """
    out: list[Record] = []
    pos, corrupt = 0, 0
    while True:
        recs, tail = read_records(data[pos:] if pos else data)  # no 16 MB copy in the common case
        out.extend(Record(pos + r.offset, r.received_unix_nano, r.payload) for r in recs)
        if tail.state != "corrupt":
            return out, ("corrupt" if corrupt else tail.state), corrupt
        corrupt += 1
        pos = _resync(data, pos + tail.offset + 1)
        if pos < 0:
            return out, "corrupt", corrupt


def _resync(data: bytes, start: int) -> int:
    """Return the next offset >= ``start`` where an intact record begins, or -1."""
    pos = data.find(MAGIC, start)
    while pos >= 0:
        recs, _ = read_records(data[pos:])
        if recs:
            return pos
        pos = data.find(MAGIC, pos + 1)
    return -1


class SpoolConverter:
    """Converts sealed spool segments into Parquet; safe to stop and restart at any point."""

    def __init__(
        self, data: Path | str, workers: int = 1, window_hours: int = 48, compact_interval: float = 60.0,
        done_retention: float = DONE_RETENTION_SECONDS, shard: tuple[int, int] = (0, 1),
        chunk_spans: int = CHUNK_SPANS,
    ) -> None:
        self.data = Path(data)
        self.shard = shard
        self.chunk_spans = chunk_spans
        self.done_retention = done_retention
        self.spool = self.data / "spool"
        self.writer = StoreWriter(self.data, window_hours)
        self.compactor = Compactor(self.data)
        self.compact_interval = compact_interval
        self._last_compact = time.monotonic()
        self._last_prune = time.monotonic()
        self.workers = workers
        self.totals = ConvertStats()
        self._rounds = 0
        self._unreleased = False  # segments converted since memory was last given back to the OS
        self._attempts: dict[str, int] = {}
        self._stats_lock = threading.Lock()

    def sealed(self) -> list[Path]:
        """Return the sealed segments waiting for conversion (by any converter), oldest first."""
        if not self.spool.exists():
            return []
        return sorted(self.spool.glob(f"*{SEALED_SUFFIX}"), key=segment_seq)

    def run_once(self) -> ConvertStats:
        """Convert every sealed segment now in the spool; stop early (and retry later) on a write error.

        Freed memory goes back to the OS at the first round that finds nothing to convert, not
        after every busy round: a converter behind on a backlog keeps its heap (giving it back
        after each segment cost ~9,500 page faults a second per converter at 40k spans/s).
        """
        stats = ConvertStats()
        if self._rounds == 0:
            clean_stage_dir(self.data, *self.shard)
        if self._rounds == 0 and self.shard[0] == 0:
            with self.writer.locked():  # another writer's temp files are not leftovers
                _remove_temp_files(self.data)
            self.compactor.cleanup()
        self._rounds += 1
        for seg in self.sealed():
            fh = claim(seg)
            if fh is None:
                continue  # another converter holds it, or has just retired it
            with fh:
                try:
                    self._convert_segment(seg, fh.fileno(), stats)
                except OSError as exc:
                    if exc.errno not in _FULL_ERRNOS:
                        raise
                    stats.write_errors += 1
                    logger.warning("cannot write Parquet (%s); %s stays in the spool, retrying later", exc, seg.name)
                    break
                except Exception as exc:  # a bug or an unexpected span shape: never block the spool forever
                    self._failed(seg, exc, stats)
        if self.shard[0] == 0 and self._compaction_due(stats):
            self.compact()
        elif self.shard[0] == 0 and time.monotonic() - self._last_prune >= PRUNE_INTERVAL_SECONDS:
            self.prune_done()  # not held back with compaction: spool/done must not grow under overload
        if stats.segments:
            self._unreleased = True
        elif self._unreleased:  # idle now: give back what conversion freed
            release_memory()
            self._unreleased = False
        with self._stats_lock:
            self.totals.add(stats)
        publish(stats)
        return stats

    def _compaction_due(self, stats: ConvertStats) -> bool:
        """Compaction yields to conversion: it runs every ``compact_interval`` once this shard has
        caught up (a round with no segment), and at least every ``COMPACT_DEFER_MAX`` intervals
        even under sustained overload, so the file count stays bounded."""
        elapsed = time.monotonic() - self._last_compact
        if elapsed < self.compact_interval:
            return False
        return stats.segments == 0 or elapsed >= COMPACT_DEFER_MAX * self.compact_interval

    def compact(self, now_unix: float | None = None) -> CompactStats:
        """Compact the partitions that are due (under the writer lock); a write error skips it."""
        self._last_compact = time.monotonic()
        result = self.compactor.run(self._swap_section, now_unix, prepare=self._before_compaction)
        self.prune_done(now_unix)
        return result

    def _before_compaction(self) -> None:
        """Make room for a merge: a swap makes every writer reload its dedupe index anyway, and
        what conversion freed goes back to the OS first, so the merge grows from less."""
        self.writer.drop_index()
        release_memory()

    @contextmanager
    def _swap_section(self) -> Iterator[None]:
        """The writer lock, with the file generation bumped after a compaction swap."""
        with self.writer.locked():
            try:
                yield
            finally:
                self.writer.bump_epoch()

    def prune_done(self, now_unix: float | None = None) -> int:
        """Delete converted segments older than ``done_retention`` seconds from ``spool/done/``."""
        self._last_prune = time.monotonic()
        limit = (time.time() if now_unix is None else now_unix) - self.done_retention
        pruned = 0
        for seg in (self.spool / "done").glob("seg-*"):
            try:
                if seg.stat().st_mtime < limit:
                    seg.unlink()
                    pruned += 1
            except FileNotFoundError:
                continue
        return pruned

    def run_forever(self, stop: threading.Event, interval: float = 0.2) -> None:
        """Convert until ``stop`` is set, then convert what is left once more."""
        while not stop.is_set():
            try:
                self.run_once()
            except Exception:
                logger.exception("spool conversion round failed; retrying")
            stop.wait(interval)
        self.run_once()

    def _convert_segment(self, seg: Path, fd: int, stats: ConvertStats) -> None:
        """Convert one sealed segment (open as ``fd``, claimed), then retire it (to ``spool/done/``, or ``quarantine/``).

        An intact segment is read record by record as its chunks are converted, so at most one
        chunk's payloads are in memory; one with a torn tail or corruption is read whole and
        scanned for every intact record.
        """
        stem = f"seg-{segment_seq(seg):020d}"
        refs = scan_headers(fd, os.fstat(fd).st_size)
        if refs is not None:
            try:
                bad_records = self._convert_refs(fd, refs, stem, stats)
            except CorruptRecord as exc:
                logger.warning("%s: %s; scanning the whole segment", seg.name, exc)
            else:
                stats.segments += 1
                stats.records += len(refs)
                self._finish(seg, bad_records > 0, stats)
                return
        self._convert_scanned(seg, stem, stats)

    def _convert_refs(self, fd: int, refs: list[RecordRef], stem: str, stats: ConvertStats) -> int:
        """Convert an intact segment's records, loaded chunk by chunk; return the bad records.

        Raises ``CorruptRecord`` (before anything is committed) when a payload fails its checksum.
        """
        hours = {r.received_unix_nano // HOUR_NS for r in refs}
        if len(hours) == 1 and self.workers == 1:
            chunks = (_load(fd, c) for c in _chunks(refs, self.chunk_spans, _ref_size))
            return self._stage(chunks, stem, hours.pop() * HOUR_NS, stats)
        pairs = _load(fd, refs)
        return self._store_pairs(pairs, stem, stats)

    def _convert_scanned(self, seg: Path, stem: str, stats: ConvertStats) -> None:
        """Convert the intact records of a damaged segment (read whole), then quarantine it."""
        records, state, corrupt = scan_segment(seg.read_bytes())
        stats.segments += 1
        stats.records += len(records)
        if state == "torn":
            stats.torn_tails += 1
            logger.warning("%s: torn tail discarded after %d intact records", seg.name, len(records))
        stats.corrupt_records += corrupt
        pairs = [(r.payload, r.received_unix_nano) for r in records]
        del records
        bad_records = 0
        hours = {received // HOUR_NS for _, received in pairs}
        if len(hours) == 1 and self.workers == 1:
            chunks = list(_chunks(pairs, self.chunk_spans, _pair_size))
            pairs.clear()
            bad_records = self._stage(_drain(chunks), stem, hours.pop() * HOUR_NS, stats)
        elif pairs:
            bad_records = self._store_pairs(pairs, stem, stats)
        self._finish(seg, state == "corrupt" or bad_records > 0, stats)

    def _finish(self, seg: Path, bad: bool, stats: ConvertStats) -> None:
        if self._rounds == 1:
            fault("recovery")
        fault("convert.after_rename")
        self._retire(seg, bad, stats)

    def _store_pairs(self, pairs: list[tuple[bytes, int]], stem: str, stats: ConvertStats) -> int:
        """Convert and store a segment spanning several receive hours; return the bad records."""
        parts = self._convert(pairs, stem)
        bad_records = sum(p.bad_records for p in parts)
        stats.corrupt_records += bad_records
        stats.spans_read += sum(p.table.num_rows for p in parts)
        self.writer.store_parts(parts, stem, stats)
        return bad_records

    def _stage(self, chunks: Iterator[list[tuple[bytes, int]]], stem: str, received: int, stats: ConvertStats) -> int:
        """Convert a one-hour segment into a staged file outside the lock, then commit it; return bad records."""
        if not self.writer.has_index():
            with self.writer.locked():  # loads the index, so known rows are dropped before staging
                pass
        staged = stage_chunks(chunks, stem, stage_dir(self.data, self.shard[0]) / f"{stem}.parquet.tmp",
                              self.writer.index)
        stats.corrupt_records += staged.bad_records
        stats.spans_read += len(staged.keys) + staged.duplicates
        stats.duplicates += staged.duplicates
        stats.conflicts += staged.conflicts
        try:
            self.writer.commit_staged(staged, hour_of(received), stem, stats)
        finally:
            staged.discard()
        bad: int = staged.bad_records
        return bad

    def _convert(self, pairs: list[tuple[bytes, int]], stem: str) -> list[Converted]:
        """Convert a segment's records in chunks of about ``chunk_spans`` spans (bounded peak memory).

        ``pairs`` is emptied: each chunk's payloads are freed once converted.
        """
        if self.workers > 1 and len(pairs) > 1:
            conv = convert_parallel(pairs, stem, self.workers)
            pairs.clear()
            return [conv]
        chunks = list(_chunks(pairs, self.chunk_spans, _pair_size))
        pairs.clear()
        return [convert_records(chunk, stem) for chunk in _drain(chunks)]

    def _failed(self, seg: Path, exc: Exception, stats: ConvertStats) -> None:
        """Count a conversion failure; after ``MAX_ATTEMPTS`` move the segment to ``spool/failed/``."""
        n = self._attempts[seg.name] = self._attempts.get(seg.name, 0) + 1
        logger.exception("converting %s failed (attempt %d of %d)", seg.name, n, MAX_ATTEMPTS)
        if n < MAX_ATTEMPTS:
            return
        failed = self.spool / "failed"
        failed.mkdir(parents=True, exist_ok=True)
        (failed / f"{seg.name}.exception").write_text(f"{type(exc).__name__}: {exc}\n")
        os.replace(seg, failed / seg.name)
        fsync_dir(failed)
        stats.failed_segments += 1

    def _retire(self, seg: Path, bad: bool, stats: ConvertStats) -> None:
        if not bad and self.done_retention <= 0:  # nothing to keep it for: its spans are committed
            seg.unlink()
            fsync_dir(seg.parent)
            return
        dest = self.data / "quarantine" if bad else self.spool / "done"
        dest.mkdir(parents=True, exist_ok=True)
        if bad:
            stats.quarantined += 1
            logger.warning("%s held corrupt records; intact ones stored, segment moved to %s", seg.name, dest)
        os.replace(seg, dest / seg.name)
        fsync_dir(dest)
        fsync_dir(seg.parent)


T = TypeVar("T")


def _chunks(items: list[T], spans: int, size: Callable[[T], int]) -> Iterator[list[T]]:
    """Split records into runs of about ``spans`` spans (estimated from payload bytes, ~1 KB a span)."""
    budget = spans * 1024
    chunk: list[T] = []
    total = 0
    for item in items:
        chunk.append(item)
        total += size(item)
        if total >= budget:
            yield chunk
            chunk, total = [], 0
    if chunk:
        yield chunk


def _pair_size(pair: tuple[bytes, int]) -> int:
    return len(pair[0])


def _ref_size(ref: RecordRef) -> int:
    return ref.length


def _drain(chunks: list[T]) -> Iterator[T]:
    """Yield and drop the items of ``chunks`` in order (each is freed once the consumer is done)."""
    while chunks:
        yield chunks.pop(0)


def _load(fd: int, refs: list[RecordRef]) -> list[tuple[bytes, int]]:
    """Read (and check) the payloads of ``refs`` with their receive times."""
    return [(read_payload(fd, r), r.received_unix_nano) for r in refs]


def claim(seg: Path) -> BinaryIO | None:
    """Open ``seg`` and take its exclusive ``flock``; ``None`` when another converter holds it or retired it.

    The lock lasts while the file stays open and dies with the process, so a crashed converter's
    segment is claimed again. A converter retires a segment (rename or unlink) before closing it:
    if ``seg`` no longer names the locked file, it was already converted.
    """
    try:
        fh = open(seg, "rb")  # noqa: SIM115 - returned open: the caller holds the claim while it works
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.stat(seg).st_ino == os.fstat(fh.fileno()).st_ino:
            return fh
    except (BlockingIOError, FileNotFoundError):
        pass
    fh.close()
    return None


def release_memory() -> None:
    """Give freed Arrow and malloc memory back to the OS (between conversion rounds)."""
    pa.default_memory_pool().release_unused()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        logger.debug("malloc_trim unavailable")


def _remove_temp_files(data: Path) -> None:
    """Delete temp files left by a crash (they were never visible to readers)."""
    root = data / "tables"
    if root.exists():
        for tmp in root.rglob("*.tmp"):
            tmp.unlink(missing_ok=True)


def ingest_requests(
    data: Path, requests: Iterable[ExportTraceServiceRequest], received_unix_nano: int,
    batch_spans: int = 32_768, source: str = "ingest",
) -> int:
    """Store requests directly (no spool), de-duplicated like spool batches; return the spans stored."""
    writer = StoreWriter(Path(data))
    stats = ConvertStats()
    chunk: list[tuple[bytes, int]] = []
    n, part = 0, 0
    stamp = f"{source}-{time.time_ns():020d}"
    for req in requests:
        chunk.append((req.SerializeToString(), received_unix_nano))
        n += sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)
        if n >= batch_spans:
            writer.store(convert_records(chunk, stamp), f"{stamp}-{part:06d}", stats)
            chunk, n, part = [], 0, part + 1
    if chunk:
        writer.store(convert_records(chunk, stamp), f"{stamp}-{part:06d}", stats)
    return stats.spans_stored
