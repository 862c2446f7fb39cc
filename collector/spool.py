"""The durable spool writer: append, group-commit fsync, seal, recover.

``SpoolWriter.append`` returns only once the record is covered by an ``fdatasync`` of its
segment: concurrent writers share one fsync (the first waiter syncs for everyone written so
far). ``<data>/spool/seg-N.open`` is sealed (fsync, rename to ``.sealed``, directory fsync) when
it reaches ``segment_bytes``, when it turns ``seal_age`` seconds old, or already at ``early_seal_age``
seconds when no sealed segment waits for conversion: with the converters idle a smaller segment reaches
a Parquet file sooner, and under a backlog the segments stay large, which converts for less CPU a span.
On start, leftover ``.open`` segments are recovered: a torn tail is truncated with a warning; a corrupt
segment's intact prefix is kept and the file quarantined.

I/O errors (disk full, EIO, read-only) raise ``SpoolUnavailable`` (retryable -> 503): the failed
group is truncated away, the segment abandoned, and writing resumes by itself when the disk
recovers (a probe runs every tick while unhealthy).
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from pathlib import Path

from tracedag.collector import faults
from tracedag.collector.metrics import REGISTRY
from tracedag.collector.spoolfmt import (
    OPEN_SUFFIX,
    SEALED_SUFFIX,
    encode_header,
    read_records,
    segment_name,
    segment_seq,
)
from tracedag.schemas.errors import Retryable, TracedagError
from tracedag.schemas.fsio import fsync_dir
from tracedag.schemas.layout import quarantine_dir, spool_dir, spool_done_dir

logger = logging.getLogger(__name__)

SEGMENT_BYTES = 16 * 1024 * 1024
SEAL_AGE_SECONDS = 0.5
EARLY_SEAL_SECONDS = 0.25
"""A segment is sealed this old when no sealed segment waits for conversion. At 10k spans/s that halves
segments to ~2,500 spans, one conversion chunk each, where a 0.5 s segment was two chunks (``CHUNK_SPANS``
4,096 and the rest): converting 100k spans in segments of ~2,500 spans took 3.37 s of CPU against 3.54 s
in segments of ~5,000 (medians of 4, alternated). A segment's own cost (its commit, renames, fsyncs and
dedupe sidecar) is a few ms."""

_FSYNC = REGISTRY.histogram("tracedag_spool_fsync_seconds", "Latency of spool fdatasync calls.")
_GROUP = REGISTRY.histogram(
    "tracedag_spool_group_commit_records", "Records covered by one spool fsync.", (1, 2, 4, 8, 16, 32, 64)
)

_RECORDS = REGISTRY.counter("tracedag_spool_records_total", "Records appended durably to the spool.")
_BYTES = REGISTRY.counter("tracedag_spool_bytes_total", "Bytes appended durably to the spool.")
_SEALED = REGISTRY.counter("tracedag_spool_segments_sealed_total", "Spool segments sealed.")
_ERRORS = REGISTRY.counter("tracedag_spool_errors_total", "Spool write errors by errno.", ("errno",))
_QUARANTINED = REGISTRY.counter("tracedag_spool_quarantined_total", "Spool segments moved to quarantine.")
_TORN = REGISTRY.counter("tracedag_spool_torn_tails_total", "Torn segment tails truncated at recovery.")


class SpoolUnavailable(TracedagError, Retryable):  # type: ignore[misc,unused-ignore]
    """The spool cannot take writes now (disk full, I/O error); retry later."""


class SpoolWriter:
    """Appends records to ``<data>/spool`` durably, with group commit and sealing."""

    def __init__(
        self, data: Path, segment_bytes: int = SEGMENT_BYTES, seal_age: float = SEAL_AGE_SECONDS,
        early_seal_age: float = EARLY_SEAL_SECONDS,
    ) -> None:
        self.data = Path(data)
        self.dir = spool_dir(self.data)
        self.quarantine = quarantine_dir(self.data)
        self.segment_bytes = segment_bytes
        self.seal_age = seal_age
        self.early_seal_age = min(early_seal_age, seal_age)
        self._cond = threading.Condition(threading.Lock())
        self._fd: int | None = None
        self._path: Path | None = None
        self._seq = 0
        self._size = 0
        self._synced_size = 0
        self._opened_at = 0.0
        self._written = 0  # tickets handed out
        self._synced = 0  # tickets covered by an fsync
        self._failed_upto = 0  # tickets whose group failed
        self._syncing = False
        self.error: str | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()  # set when a segment opens (and on close): the sealer times its age
        self._ticker: threading.Thread | None = None
        self.dir.mkdir(parents=True, exist_ok=True)
        self._seq = recover_spool(self.data)

    # -- appending -----------------------------------------------------------------------

    def append(self, payload: bytes, received_unix_nano: int) -> None:
        """Append one record and return once it is fsynced; raise ``SpoolUnavailable`` on I/O errors."""
        header = encode_header(payload, received_unix_nano)
        with self._cond:
            ticket = self._write_locked(header, payload)
            faults.hit("after_write_before_fsync")
            self._wait_synced_locked(ticket)
        faults.hit("after_fsync_before_ack")
        _RECORDS.inc()
        _BYTES.inc(len(header) + len(payload))

    def _write_locked(self, header: bytes, payload: bytes) -> int:
        total = len(header) + len(payload)
        try:
            fd = self._ensure_open_locked()
            done = os.writev(fd, [header, payload])
            if done < total:  # short write: finish the rest
                rest = memoryview(header + payload)[done:]
                while rest:
                    rest = rest[os.write(fd, rest) :]
        except OSError as exc:
            self._fail_locked(exc)
            raise SpoolUnavailable(_reason(exc)) from exc
        self._size += total
        self._written += 1
        return self._written

    def _wait_synced_locked(self, ticket: int) -> None:
        while self._synced < ticket:
            if self._failed_upto >= ticket:
                raise SpoolUnavailable(self.error or "spool write failed")
            if self._syncing:
                self._cond.wait()
                continue
            self._sync_group_locked()
        if self._size >= self.segment_bytes and not self._syncing:
            self._seal_locked()

    def _sync_group_locked(self) -> None:
        """Become the leader: fsync everything written so far, with the lock released."""
        fd, target, size = self._fd, self._written, self._size
        if fd is None:
            raise SpoolUnavailable(self.error or "spool segment closed")
        self._syncing = True
        self._cond.release()
        started = time.monotonic()
        err: OSError | None = None
        try:
            os.fdatasync(fd)
        except OSError as exc:
            err = exc
        finally:
            self._cond.acquire()
            self._syncing = False
        _FSYNC.observe(time.monotonic() - started)
        if err is not None:
            self._fail_locked(err)
            raise SpoolUnavailable(_reason(err)) from err
        _GROUP.observe(target - self._synced)
        self._synced, self._synced_size = target, size
        self._clear_error_locked()
        self._cond.notify_all()

    def _ensure_open_locked(self) -> int:
        if self._fd is not None:
            return self._fd
        self._seq = max(self._seq + 1, time.time_ns() // 1000)
        path = self.dir / segment_name(self._seq, OPEN_SUFFIX)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        self._opened_at = time.monotonic()  # before the path: the sealer reads the path, then the age, unlocked
        self._fd, self._path = fd, path
        self._size = self._synced_size = 0
        self._wake.set()
        try:
            fsync_dir(self.dir)
        except OSError:
            self._abandon_locked()
            raise
        return fd

    # -- failures ------------------------------------------------------------------------

    def _fail_locked(self, exc: OSError) -> None:
        """Fail every unsynced record, cut them off the segment and abandon it."""
        _ERRORS.inc(errno=errno.errorcode.get(exc.errno or 0, str(exc.errno)))
        while self._syncing:  # never close the fd under another thread's fsync
            self._cond.wait()
        self.error = _reason(exc)
        logger.error("spool write failed: %s", self.error)
        self._failed_upto = self._written
        self._cond.notify_all()
        self._abandon_locked()

    def _abandon_locked(self) -> None:
        fd, path, keep = self._fd, self._path, self._synced_size
        self._fd, self._path = None, None
        self._size = self._synced_size = 0
        if fd is None or path is None:
            return
        try:
            os.ftruncate(fd, keep)
        except OSError:
            logger.warning("could not truncate %s; unacknowledged records may remain", path.name)
        os.close(fd)
        try:
            if keep:
                _seal_path(path)
                _SEALED.inc()
            else:
                path.unlink()
        except OSError as exc:
            logger.warning("could not settle abandoned segment %s: %s", path.name, exc)

    def _clear_error_locked(self) -> None:
        if self.error is not None:
            logger.warning("spool writable again after: %s", self.error)
            self.error = None

    def _probe(self) -> None:
        """While unhealthy, test whether the disk takes writes again."""
        probe = self.dir / ".probe"
        try:
            with open(probe, "wb") as fh:
                fh.write(b"\0" * 65536)
                fh.flush()
                os.fsync(fh.fileno())
            probe.unlink()
        except OSError:
            probe.unlink(missing_ok=True)
            return
        with self._cond:
            self._clear_error_locked()

    # -- sealing -------------------------------------------------------------------------

    def _seal_locked(self) -> None:
        """fsync, close and rename the open segment (caller holds the lock, no sync running)."""
        fd, path = self._fd, self._path
        if fd is None or path is None:
            return
        try:
            os.fdatasync(fd)
        except OSError as exc:
            self._fail_locked(exc)
            return
        self._synced, self._synced_size = self._written, self._size
        self._cond.notify_all()
        os.close(fd)
        self._fd, self._path = None, None
        try:
            _seal_path(path)
        except OSError as exc:
            self.error = _reason(exc)
            logger.error("could not seal %s: %s", path.name, exc)
            return
        _SEALED.inc()

    def _seal_when_idle(self, due: bool) -> None:
        early = None if due else self._early_path()
        with self._cond:
            while self._syncing:
                self._cond.wait()
            if self._fd is None:
                return
            if due or time.monotonic() - self._opened_at >= self.seal_age or (early and early == self._path):
                self._seal_locked()

    def _early_path(self) -> Path | None:
        """The open segment's path when it may be sealed early: ``early_seal_age`` old and no sealed segment
        waiting for conversion. Checked without the lock (a listing of the spool); the caller seals only if
        that segment is still the open one."""
        path = self._path
        if path is None or time.monotonic() - self._opened_at < self.early_seal_age:
            return None
        try:
            with os.scandir(self.dir) as entries:
                if any(e.name.endswith(SEALED_SUFFIX) for e in entries):
                    return None
        except OSError:
            return None
        return path

    def flush(self) -> None:
        """Seal the open segment now (everything appended so far becomes convertible)."""
        self._seal_when_idle(True)

    def tick(self) -> None:
        """Seal an aged segment and probe the disk when unhealthy; called periodically."""
        self._seal_when_idle(False)
        if self.error is not None:
            self._probe()

    def start(self, interval: float = 0.1) -> None:
        """Run ``tick`` every ``interval`` seconds in a daemon thread."""
        self._ticker = threading.Thread(target=self._run, args=(interval,), name="spool-sealer", daemon=True)
        self._ticker.start()

    def _run(self, interval: float) -> None:
        while True:
            self._wake.wait(self._next_tick(interval))
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.tick()
            except Exception:
                logger.exception("spool sealer tick failed")

    def _next_tick(self, interval: float) -> float:
        """Seconds to the next tick: ``interval``, or less when the open segment turns ``early_seal_age`` or
        ``seal_age`` sooner, so it is sealed at that age, not up to ``interval`` later (a segment's opening
        wakes the sealer to time it). Read without the lock: a stale value only adds a tick."""
        if self._fd is None:
            return interval
        age = time.monotonic() - self._opened_at
        due = (self.early_seal_age if age < self.early_seal_age else self.seal_age) - age
        return min(interval, max(due, 0.001))

    def close(self) -> None:
        """Stop the sealer and seal the open segment."""
        self._stop.set()
        self._wake.set()
        if self._ticker is not None:
            self._ticker.join()
        self.flush()

    # -- introspection -------------------------------------------------------------------

    def backlog(self) -> tuple[int, int]:
        """Return (segments, bytes) sealed but not yet converted."""
        count = total = 0
        for path in self.dir.glob(f"*{SEALED_SUFFIX}"):
            try:
                total += path.stat().st_size
            except FileNotFoundError:
                continue
            count += 1
        return count, total


def _reason(exc: OSError) -> str:
    name = errno.errorcode.get(exc.errno or 0, "I/O error")
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"disk full ({name}) in the spool"
    return f"spool I/O error ({name}: {exc.strerror})"


def _seal_path(path: Path) -> Path:
    sealed = path.with_name(path.name[: -len(OPEN_SUFFIX)] + SEALED_SUFFIX)
    os.replace(path, sealed)
    fsync_dir(path.parent)
    return sealed


def recover_spool(data: Path) -> int:
    """Seal leftover ``.open`` segments (truncating torn tails, quarantining corruption); return the max seq."""
    spool = spool_dir(data)
    top = 0
    for path in sorted(spool.glob(f"*{OPEN_SUFFIX}")):
        _recover_open(data, path)
    for folder in (spool, spool_done_dir(data), quarantine_dir(data)):
        for path in folder.glob("seg-*"):
            try:
                top = max(top, segment_seq(path))
            except (ValueError, IndexError):
                continue
    return top


def _recover_open(data: Path, path: Path) -> None:
    raw = path.read_bytes()
    records, tail = read_records(raw)
    if tail.state == "corrupt":
        _quarantine_open(data, path, raw[: tail.offset])
        return
    if tail.state == "torn":
        logger.warning(
            "spool segment %s: torn tail of %d bytes after %d records discarded (never acknowledged)",
            path.name, len(raw) - tail.offset, len(records),
        )
        _TORN.inc()
        with open(path, "r+b") as fh:
            fh.truncate(tail.offset)
            fh.flush()
            os.fsync(fh.fileno())
    if tail.offset == 0:
        path.unlink()
        fsync_dir(path.parent)
        return
    _seal_path(path)


def _quarantine_open(data: Path, path: Path, intact: bytes) -> None:
    """Keep the intact prefix as a sealed segment; move the corrupt file to quarantine."""
    quarantine = quarantine_dir(data)
    quarantine.mkdir(parents=True, exist_ok=True)
    logger.error("spool segment %s is corrupt after byte %d: quarantined", path.name, len(intact))
    _QUARANTINED.inc()
    if intact:
        salvage = path.with_name(segment_name(segment_seq(path), ".salvage"))
        with open(salvage, "wb") as fh:
            fh.write(intact)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(salvage, path.with_name(segment_name(segment_seq(path), SEALED_SUFFIX)))
        fsync_dir(path.parent)
    os.replace(path, quarantine / path.name)
    fsync_dir(quarantine)
    fsync_dir(path.parent)
