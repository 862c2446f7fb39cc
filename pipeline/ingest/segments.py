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
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, TypeVar

import pyarrow as pa

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
    segment_stem,
)
from tracedag.pipeline.convert.converted import Converted
from tracedag.pipeline.convert.records import convert_records
from tracedag.pipeline.ingest.stage import clean_stage_dir, stage_chunks, stage_dir
from tracedag.pipeline.ingest.writer import HOUR_NS, ConvertStats, StoreWriter, hour_of, publish
from tracedag.pipeline.store.compact import Compactor, CompactStats
from tracedag.pipeline.store.gc import prune_spool_done
from tracedag.schemas.fsio import fsync_dir, lock_fd
from tracedag.schemas.layout import (
    quarantine_dir,
    spool_dir,
    spool_done_dir,
    spool_failed_dir,
    tables_dir,
)

logger = logging.getLogger(__name__)

MAX_ATTEMPTS = 3
"""Conversion attempts of a segment (other than for a full disk) before it moves to ``spool/failed/``."""

CHUNK_SPANS = 4096
"""Spans converted together. Per CPU-second 4096 converts 1.07x faster than 2048 and 0.95x as fast
as 8192, whose transient memory is ~20 MB larger per converter process (``bench/convert.py``)."""

COMPACT_DEFER_MAX = 10
"""While conversion is behind, compaction waits at most this many compaction intervals."""

PRUNE_INTERVAL_SECONDS = 10.0
"""How often converter 0 deletes the segments of ``spool/done/`` past their retention."""

RELEASE_IDLE_SECONDS = 1.0
"""Memory freed by conversion goes back to the OS once a converter has converted nothing for this long. Giving it
back at every idle round cost ~10 ms of CPU a segment at 10k spans/s (the heap grows again, page by page, for the
next segment): 100k spans in 2,500-span segments took 3.90 s of CPU with a release after each, 3.51 s without
(medians of 3)."""

_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS}


def fault(point: str) -> None:
    """Exit the process abruptly (as ``kill -9`` would) when ``point`` is listed in ``TRACEDAG_FAULT``."""
    faults.hit(point)


def _made(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder


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
        chunk_spans: int = CHUNK_SPANS, stage: Path | None = None,
    ) -> None:
        self.data = Path(data)
        self.shard = shard
        self.stage = stage  # where one-hour segments are staged (default: this shard's folder)
        self.chunk_spans = chunk_spans
        self.done_retention = done_retention
        self.spool = spool_dir(self.data)
        self.writer = StoreWriter(self.data, window_hours)
        self.compactor = Compactor(self.data)
        self.compact_interval = compact_interval
        self._last_compact = time.monotonic()
        self._last_prune = time.monotonic()
        self.workers = workers
        self.totals = ConvertStats()
        self._rounds = 0
        self._unreleased = 0.0  # when the last segment was converted since memory was last given back (0: none)
        self._attempts: dict[str, int] = {}
        self._stats_lock = threading.Lock()

    def sealed(self) -> list[Path]:
        """Return the sealed segments waiting for conversion (by any converter), oldest first."""
        if not self.spool.exists():
            return []
        return sorted(self.spool.glob(f"*{SEALED_SUFFIX}"), key=segment_seq)

    def run_once(self) -> ConvertStats:
        """Convert every sealed segment now in the spool; stop early (and retry later) on a write error.

        Freed memory goes back to the OS at the first round that finds nothing to convert
        ``RELEASE_IDLE_SECONDS`` after the last conversion, not after every busy round: a converter
        behind on a backlog, or converting every sealed segment as it comes, keeps its heap (giving
        it back after each segment cost ~9,500 page faults a second per converter at 40k spans/s).
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
                if not self._convert_held(seg, fh.fileno(), stats):
                    break
        if self.shard[0] == 0 and self._compaction_due(stats):
            self.compact()
        elif self.shard[0] == 0 and time.monotonic() - self._last_prune >= PRUNE_INTERVAL_SECONDS:
            self.prune_done()  # not held back with compaction: spool/done must not grow under overload
        if stats.segments:
            self._unreleased = time.monotonic()
        elif self._unreleased and time.monotonic() - self._unreleased >= RELEASE_IDLE_SECONDS:
            release_memory()  # idle for a while now: give back what conversion freed
            self._unreleased = 0.0
        with self._stats_lock:
            self.totals.add(stats)
        publish(stats)
        return stats

    def convert_claimed(self, seg: Path, fd: int) -> ConvertStats:
        """Convert one segment whose claim the caller holds (``fd``); return the counters.

        A full disk leaves the segment in the spool (``write_errors``); other failures count
        towards ``MAX_ATTEMPTS`` as in ``run_once``.
        """
        stats = ConvertStats()
        self._convert_held(seg, fd, stats)
        with self._stats_lock:
            self.totals.add(stats)
        publish(stats)
        return stats

    def remove_stage(self) -> None:
        """Remove a private staging folder (``stage=``) once this converter is done."""
        if self.stage is not None:
            shutil.rmtree(self.stage, ignore_errors=True)

    def _convert_held(self, seg: Path, fd: int, stats: ConvertStats) -> bool:
        """Convert a claimed segment; False when the disk is full (stop this round, retry later)."""
        try:
            self._convert_segment(seg, fd, stats)
        except OSError as exc:
            if exc.errno not in _FULL_ERRNOS:
                raise
            stats.write_errors += 1
            logger.warning("cannot write Parquet (%s); %s stays in the spool, retrying later", exc, seg.name)
            return False
        except Exception as exc:  # a bug or an unexpected span shape: never block the spool forever
            self._failed(seg, exc, stats)
        return True

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
        return prune_spool_done(self.data, self.done_retention, now_unix)

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
        stem = segment_stem(seg)
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
        folder = stage_dir(self.data, self.shard[0]) if self.stage is None else _made(self.stage)
        staged = stage_chunks(chunks, stem, folder / f"{stem}.parquet.tmp",
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
            # multiprocessing only when asked for
            from tracedag.pipeline.convert.pool import convert_parallel

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
        failed = spool_failed_dir(self.data)
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
        dest = quarantine_dir(self.data) if bad else spool_done_dir(self.data)
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
        if lock_fd(fh.fileno(), wait=False) and os.stat(seg).st_ino == os.fstat(fh.fileno()).st_ino:
            return fh
    except FileNotFoundError:
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


LEFTOVER_SECONDS = 600.0
"""A temp file of another stage's table (a build's, a scorer's) untouched this long is a crash's leftover."""


def _remove_temp_files(data: Path) -> None:
    """Delete temp files left by a crash (they were never visible to readers): every one of ``spans`` (the
    converter's writer lock is held, so no spans writer is writing), and of the other tables only those not
    written for ``LEFTOVER_SECONDS``: a build or a scorer beside this converter's start (a live collector's first
    round, ``tracedag score``) writes its files as ``.tmp`` and renames them, under locks of their own."""
    root = tables_dir(data)
    if not root.exists():
        return
    old = time.time() - LEFTOVER_SECONDS
    for tmp in root.rglob("*.tmp"):
        try:
            if tmp.relative_to(root).parts[0] == "spans" or tmp.stat().st_mtime < old:
                tmp.unlink(missing_ok=True)
        except FileNotFoundError:
            continue  # renamed by its writer meanwhile
