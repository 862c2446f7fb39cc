"""The ways in besides the collector (dump files, requests handed over in-process) take the same road.

Their batches become sealed spool segments named ``seg-<seq>.file.sealed``, written and fsynced
by this process while it holds the segment's claim (the same ``flock`` converters take), and this
process converts them at once with the spool converter: the same decoding, de-duplication,
quarantine, quality flags and ``spool/done/`` retention as collected spans. A running
collector's converters skip them while they are claimed; a segment left behind by a crash is
converted by the next converter that runs (``tracedag collect`` or ``tracedag ingest``).

Their spans carry ``batch_id = seg-<seq>-file``: ``tracedag build`` treats a trace whose spans
all came from files as complete at once (the idle window is for live traffic only).
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tracedag.collector.spoolfmt import FILLING_SUFFIX, SEALED_SUFFIX, encode_record, file_segment_name
from tracedag.pipeline.ingest.segments import SpoolConverter
from tracedag.pipeline.ingest.writer import ConvertStats
from tracedag.schemas.fsio import fsync_dir, lock_fd
from tracedag.schemas.layout import ingest_stage_dir, spool_dir

logger = logging.getLogger(__name__)

BATCH_SPANS = 32_768
"""Spans per segment written by a direct ingest (one conversion each)."""


class DirectIngest:
    """Buffers payloads into file segments of about ``batch_spans`` spans and converts each at once."""

    def __init__(self, data: Path, batch_spans: int = BATCH_SPANS, received_unix_nano: int | None = None) -> None:
        self.data = Path(data)
        self.batch_spans = batch_spans
        self.received = received_unix_nano or time.time_ns()
        self.converter = SpoolConverter(self.data, stage=ingest_stage_dir(self.data, os.getpid()))
        self.stats = ConvertStats()
        self._records: list[bytes] = []
        self._spans = 0
        remove_abandoned(self.data)

    def add(self, payload: bytes, spans: int) -> None:
        """Add one serialized request of ``spans`` valid spans; a full batch is spooled and converted."""
        self._records.append(encode_record(payload, self.received))
        self._spans += spans
        if self._spans >= self.batch_spans:
            self.flush()

    def flush(self) -> ConvertStats:
        """Spool and convert what is buffered; return the counters of that conversion."""
        if not self._records:
            return ConvertStats()
        records, self._records, self._spans = self._records, [], 0
        seg, fd = write_segment(self.data, records)
        try:
            stats = self.converter.convert_claimed(seg, fd)
        finally:
            os.close(fd)
        self.stats.add(stats)
        if stats.write_errors:
            raise OSError(errno.ENOSPC, f"cannot write Parquet; {seg.name} stays in the spool and is "
                                        "converted by the next tracedag ingest or collect", str(seg))
        return stats

    def close(self) -> ConvertStats:
        """Flush, remove this process's staging folder and return the counters of everything added."""
        self.flush()
        self.converter.remove_stage()
        return self.stats


def write_segment(data: Path, records: list[bytes]) -> tuple[Path, int]:
    """Write ``records`` as a new sealed file segment, durably; return it with a descriptor holding its claim."""
    spool = spool_dir(data)
    spool.mkdir(parents=True, exist_ok=True)
    seq = time.time_ns() // 1000
    while True:
        filling = spool / file_segment_name(seq, FILLING_SUFFIX)
        sealed = spool / file_segment_name(seq, SEALED_SUFFIX)
        try:
            fd = os.open(filling, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except FileExistsError:
            seq += 1
            continue
        if sealed.exists():
            os.close(fd)
            filling.unlink()
            seq += 1
            continue
        break
    try:
        lock_fd(fd)  # the claim: no converter takes the segment until this process is done with it
        _write_all(fd, b"".join(records))
        os.fsync(fd)
        os.replace(filling, sealed)
        fsync_dir(spool)
    except BaseException:
        os.close(fd)
        filling.unlink(missing_ok=True)
        raise
    return sealed, fd


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def remove_abandoned(data: Path, min_age: float = 60.0) -> int:
    """Delete ``.filling`` segments no live process holds (an ingest that crashed while writing one).

    Only files untouched for ``min_age`` seconds are looked at: a new one is locked by its
    writer right after it is created.
    """
    removed = 0
    spool = spool_dir(data)
    limit = time.time() - min_age
    for path in spool.glob(f"*{FILLING_SUFFIX}") if spool.exists() else ():
        try:
            if path.stat().st_mtime > limit:
                continue
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            if lock_fd(fd, wait=False):
                path.unlink(missing_ok=True)
                removed += 1
        finally:
            os.close(fd)
    return removed


def ingest_requests(
    data: Path, requests: Iterable[ExportTraceServiceRequest], received_unix_nano: int,
    batch_spans: int = BATCH_SPANS,
) -> int:
    """Store requests handed over in-process (through file segments); return the spans stored."""
    direct = DirectIngest(Path(data), batch_spans, received_unix_nano)
    for req in requests:
        direct.add(req.SerializeToString(), sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans))
    return direct.close().spans_stored
