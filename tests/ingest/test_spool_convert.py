"""Spool segments -> Parquet: dedupe (E40), torn/corrupt segments (E43, E44), disk full (E45), dates (C32)."""

from __future__ import annotations

import random
import time
from functools import cache
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from bench.gen import requests
from tests.ingest.ingest_support import request_ids, span_count, stored, stored_ids, write_segment
from tracedag.collector.metrics import REGISTRY
from tracedag.collector.spool import SpoolWriter
from tracedag.collector.spoolfmt import HEADER_SIZE
from tracedag.pipeline.ingest.segments import SpoolConverter
from tracedag.pipeline.store.views import connect

NOW = time.time_ns()


@cache
def _pool() -> tuple[bytes, ...]:
    """6 generated requests of 512 spans, made once per module (~0.12 s of CPU per 1,000 spans)."""
    return tuple(r.SerializeToString() for r in requests(6 * 512, seed=1))


def _reqs(n_spans: int) -> list[ExportTraceServiceRequest]:
    """Fresh copies (a test may change them) of the first requests of the pool holding ``n_spans`` spans."""
    return [ExportTraceServiceRequest.FromString(b) for b in _pool()[: -(-n_spans // 512)]]


def test_real_spool_writer_segments_are_converted_and_moved_to_done(data: Path) -> None:
    reqs = _reqs(2000)
    writer = SpoolWriter(data, segment_bytes=600_000)
    for r in reqs:
        writer.append(r.SerializeToString(), time.time_ns())
    writer.flush()
    writer.close()
    conv = SpoolConverter(data)
    st = conv.run_once()
    assert st.spans_stored == sum(span_count(r) for r in reqs) == stored(data)[0]
    assert stored_ids(data) == request_ids(reqs)
    assert not list((data / "spool").glob("*.sealed"))
    assert len(list((data / "spool" / "done").glob("*.sealed"))) == st.segments > 1


def test_each_chunk_is_one_row_group_in_arrival_order(data: Path) -> None:
    reqs = _reqs(1500)
    write_segment(data, 1, [(r.SerializeToString(), NOW) for r in reqs])
    SpoolConverter(data, chunk_spans=300).run_once()  # several chunks: one file, one row group each
    (f,) = list((data / "tables" / "spans").rglob("*.parquet"))
    pf = pq.ParquetFile(f)
    arrived = [s.span_id.hex() for r in reqs for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert pf.num_row_groups == len(reqs) > 1  # a chunk takes whole requests: 512 spans each here
    stored_order = [row["span_id"] for g in range(pf.num_row_groups)
                    for row in pf.read_row_group(g, columns=["span_id"]).to_pylist()]
    assert stored_order == arrived


def test_e40_same_body_twice_and_across_restarts_is_stored_once(data: Path) -> None:
    reqs = _reqs(1000)
    body = [(r.SerializeToString(), NOW) for r in reqs]
    write_segment(data, 1, body)
    write_segment(data, 2, body)
    conv = SpoolConverter(data)
    st = conv.run_once()
    n = sum(span_count(r) for r in reqs)
    assert (st.spans_stored, st.duplicates, st.conflicts) == (n, n, 0)
    write_segment(data, 3, body[:1])
    st2 = SpoolConverter(data).run_once()  # a new process: the index comes back from the files
    assert (st2.spans_stored, st2.duplicates) == (0, span_count(reqs[0]))
    assert stored(data) == (n, n)


def test_e40_same_spans_rebatched_differently_are_stored_once(data: Path) -> None:
    reqs = _reqs(1024)
    spans = [(rs.resource, ss.scope, s) for r in reqs for rs in r.resource_spans for ss in rs.scope_spans
             for s in ss.spans]
    random.Random(0).shuffle(spans)
    rebatched = []
    for i in range(0, len(spans), 300):
        req = ExportTraceServiceRequest()
        for res, scope, s in spans[i : i + 300]:
            rs = req.resource_spans.add()
            rs.resource.CopyFrom(res)
            ss = rs.scope_spans.add()
            ss.scope.CopyFrom(scope)
            ss.spans.append(s)
        rebatched.append(req)
    write_segment(data, 1, [(r.SerializeToString(), NOW) for r in reqs])
    write_segment(data, 2, [(r.SerializeToString(), NOW) for r in rebatched])
    st = SpoolConverter(data).run_once()
    assert st.duplicates == len(spans) and st.conflicts == 0
    assert stored(data) == (len(spans), len(spans))


def test_e40_same_id_different_content_first_write_wins_and_counts_a_conflict(data: Path) -> None:
    first = _reqs(600)[0]
    changed = ExportTraceServiceRequest()
    changed.CopyFrom(first)
    for s in changed.resource_spans[0].scope_spans[0].spans[:10]:
        s.name = "rewritten"
    before = REGISTRY.counter("tracedag_ingest_conflicts_total", "").value()
    write_segment(data, 1, [(first.SerializeToString(), NOW)])
    write_segment(data, 2, [(changed.SerializeToString(), NOW)])
    st = SpoolConverter(data).run_once()
    assert st.conflicts == 10 and st.duplicates == span_count(first)
    names = connect(data).execute("select count(*) from spans where name = 'rewritten'").fetchone()
    assert names == (0,)
    assert REGISTRY.counter("tracedag_ingest_conflicts_total", "").value() - before == 10


def test_e43_torn_tail_keeps_every_intact_record(data: Path) -> None:
    reqs = _reqs(1536)
    seg = write_segment(data, 7, [(r.SerializeToString(), NOW) for r in reqs])
    size = seg.stat().st_size
    last = len(reqs[-1].SerializeToString()) + HEADER_SIZE
    cut = random.Random(1).randrange(size - last + 1, size)  # somewhere inside the last record
    with open(seg, "r+b") as fh:
        fh.truncate(cut)
    st = SpoolConverter(data).run_once()
    assert st.torn_tails == 1 and st.quarantined == 0
    assert stored_ids(data) == request_ids(reqs[:-1])
    assert (data / "spool" / "done" / seg.name).exists()


def test_e44_corrupt_middle_record_quarantines_the_segment_and_keeps_the_others(data: Path) -> None:
    reqs = _reqs(1536)
    bodies = [r.SerializeToString() for r in reqs]
    seg = write_segment(data, 8, [(b, NOW) for b in bodies])
    middle = HEADER_SIZE * 2 + len(bodies[0]) + 100  # inside the payload of record 2
    raw = bytearray(seg.read_bytes())
    raw[middle : middle + 8] = bytes(8)
    seg.write_bytes(bytes(raw))
    st = SpoolConverter(data).run_once()
    assert st.quarantined == 1 and st.corrupt_records >= 1
    assert stored_ids(data) == request_ids([reqs[0], reqs[2]])
    assert (data / "quarantine" / seg.name).exists()


def test_e44_record_with_good_checksum_but_bad_protobuf_is_skipped(data: Path) -> None:
    good = _reqs(600)[0]
    write_segment(data, 9, [(b"\x0a\xff\xff\xff\xff\x0f", NOW), (good.SerializeToString(), NOW)])
    st = SpoolConverter(data).run_once()
    assert st.corrupt_records == 1 and st.quarantined == 1
    assert stored_ids(data) == request_ids([good])


def test_e45_disk_full_leaves_the_spool_intact_and_resumes(data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reqs = _reqs(1000)
    seg = write_segment(data, 10, [(r.SerializeToString(), NOW) for r in reqs])
    monkeypatch.setenv("TRACEDAG_FAULT", "enospc")
    conv = SpoolConverter(data)
    st = conv.run_once()
    assert st.write_errors == 1 and st.spans_stored == 0
    assert seg.exists()
    assert not [p for p in (data / "tables").rglob("*") if p.is_file() and "spans" in p.parts]
    monkeypatch.delenv("TRACEDAG_FAULT")
    st = conv.run_once()
    n = sum(span_count(r) for r in reqs)
    assert st.spans_stored == n and stored(data) == (n, n)
    assert not seg.exists()


def test_c32_crafted_span_dates_are_stored_in_the_receive_hour(data: Path) -> None:
    req = _reqs(600)[0]
    spans = [s for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]
    year_ns = 365 * 24 * 3600 * 10**9
    stamps = [0, 1, 4_102_444_800 * 10**9, NOW - 30 * 24 * 3600 * 10**9, NOW + 3600 * 10**9]
    for i, s in enumerate(spans):  # every span in a different year, plus the named cases
        start = stamps[i] if i < len(stamps) else (i * year_ns) % (2**62)
        s.start_time_unix_nano, s.end_time_unix_nano = start, start + 1000
    write_segment(data, 11, [(req.SerializeToString(), NOW)])
    SpoolConverter(data).run_once()
    parts = list((data / "tables" / "spans").iterdir())
    assert len(parts) == 1 and len(list(parts[0].glob("*.parquet"))) == 1
    assert stored(data)[0] == len(spans)
    for stamp in stamps:
        row = connect(data).execute("select count(*) from spans where start_time_unix_nano = $s",
                                {"s": stamp}).fetchone()
        assert row == (1,)


def test_receive_hours_split_a_segment_into_partitions(data: Path) -> None:
    reqs = _reqs(1536)
    hour = 3600 * 10**9
    write_segment(data, 12, [(r.SerializeToString(), NOW - i * hour) for i, r in enumerate(reqs)])
    SpoolConverter(data).run_once()
    parts = sorted(p.name for p in (data / "tables" / "spans").iterdir())
    assert len(parts) == len(reqs)
    assert all(p.startswith("recv_hour=") for p in parts)
    assert stored_ids(data) == request_ids(reqs)


def test_a_segment_that_keeps_failing_moves_to_failed_and_the_rest_goes_on(
    data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tracedag.pipeline.ingest.segments as ingest
    import tracedag.pipeline.ingest.stage as ingest_stage

    reqs = _reqs(1024)
    bad = write_segment(data, 1, [(reqs[0].SerializeToString(), NOW)])
    write_segment(data, 2, [(reqs[1].SerializeToString(), NOW)])
    real = ingest.convert_records

    def flaky(records, stem, *args, **kw):  # injected fault: segment 1 always fails to convert
        if stem.endswith("1"):
            raise ValueError("injected conversion fault")
        return real(records, stem, *args, **kw)

    monkeypatch.setattr(ingest, "convert_records", flaky)
    monkeypatch.setattr(ingest_stage, "convert_records", flaky)  # the staged (one-hour) path
    conv = SpoolConverter(data)
    for _ in range(ingest.MAX_ATTEMPTS):
        conv.run_once()
    assert stored_ids(data) == request_ids([reqs[1]])
    assert (data / "spool" / "failed" / bad.name).exists()
    assert "injected" in (data / "spool" / "failed" / f"{bad.name}.exception").read_text()
    assert conv.totals.failed_segments == 1


def test_converted_segments_are_kept_in_done_then_pruned_after_the_retention(data: Path) -> None:
    write_segment(data, 1, [(_reqs(600)[0].SerializeToString(), NOW)])
    conv = SpoolConverter(data, done_retention=3600)
    conv.run_once()
    done = data / "spool" / "done" / "seg-00000000000000000001.sealed"
    assert done.exists()
    assert conv.prune_done(time.time() + 60) == 0 and done.exists()
    assert conv.prune_done(time.time() + 7200) == 1 and not done.exists()
    assert stored(data)[0] > 0


def test_intact_segment_is_read_chunk_by_chunk_not_whole(data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tracedag.pipeline.ingest.segments as ingest
    import tracedag.pipeline.ingest.stage as stage

    reqs = _reqs(3000)
    write_segment(data, 11, [(r.SerializeToString(), NOW) for r in reqs])
    events: list[str] = []
    real_read, real_convert = ingest.read_payload, stage.convert_records
    monkeypatch.setattr(ingest, "read_payload", lambda fd, ref: events.append("read") or real_read(fd, ref))
    monkeypatch.setattr(stage, "convert_records", lambda *a, **kw: events.append("convert") or real_convert(*a, **kw))
    st = SpoolConverter(data, chunk_spans=300).run_once()
    assert st.spans_stored == sum(span_count(r) for r in reqs) == stored(data)[0]
    assert events.count("read") == len(reqs) and events.count("convert") > 1
    assert events.index("convert") < len(events) - 1 - events[::-1].index("read")  # reads interleave


def test_corrupt_payload_in_a_late_chunk_falls_back_to_the_whole_scan(data: Path) -> None:
    reqs = _reqs(3000)
    bodies = [r.SerializeToString() for r in reqs]
    seg = write_segment(data, 12, [(b, NOW) for b in bodies])
    last = seg.stat().st_size - len(bodies[-1]) + 50  # inside the last payload: earlier chunks are staged first
    raw = bytearray(seg.read_bytes())
    raw[last : last + 8] = bytes(8)
    seg.write_bytes(bytes(raw))
    st = SpoolConverter(data, chunk_spans=300).run_once()
    assert st.quarantined == 1 and st.corrupt_records >= 1 and st.segments == 1
    assert stored_ids(data) == request_ids(reqs[:-1])
    assert not list((data / "state").rglob("*.tmp"))


def test_retention_zero_deletes_converted_segments_and_keeps_corrupt_ones(data: Path) -> None:
    reqs = _reqs(1024)
    write_segment(data, 13, [(reqs[0].SerializeToString(), NOW)])
    bad = write_segment(data, 14, [(b"\x0a\xff\xff\xff\xff\x0f", NOW), (reqs[1].SerializeToString(), NOW)])
    st = SpoolConverter(data, done_retention=0).run_once()
    assert st.spans_stored == span_count(reqs[0]) + span_count(reqs[1])
    assert not list((data / "spool").rglob("seg-*"))  # neither waiting nor in spool/done
    assert (data / "quarantine" / bad.name).exists()  # kept for a person to look at


def test_done_segments_are_pruned_even_while_compaction_is_held_back(
        data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    import tracedag.pipeline.ingest.segments as ingest

    reqs = _reqs(1024)
    write_segment(data, 15, [(reqs[0].SerializeToString(), NOW)])
    conv = SpoolConverter(data, done_retention=3600, compact_interval=1e9)
    conv.run_once()
    (done,) = list((data / "spool" / "done").iterdir())
    os.utime(done, (time.time() - 7200, time.time() - 7200))
    monkeypatch.setattr(ingest, "PRUNE_INTERVAL_SECONDS", 0.0)
    conv.run_once()  # no compaction is due (interval 1e9 s), the prune still runs
    assert not done.exists()


def test_memory_goes_back_to_the_os_only_after_a_converter_idled_a_while(
    data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.store.objfixtures import Calls
    from tracedag.pipeline.ingest import segments

    monkeypatch.setattr(segments, "RELEASE_IDLE_SECONDS", 0.3)
    released = Calls(monkeypatch, segments, "release_memory")
    conv = SpoolConverter(data)
    for seq, req in enumerate(_reqs(1024), start=1):
        write_segment(data, seq, [(req.SerializeToString(), NOW)])
        assert conv.run_once().segments == 1
        assert conv.run_once().segments == 0  # idle, but a segment comes every so often: the heap stays
    assert released.count == 0
    time.sleep(0.35)
    conv.run_once()
    assert released.count == 1  # idle for RELEASE_IDLE_SECONDS: given back, once
    conv.run_once()
    assert released.count == 1
