"""Several converters sharing the spool, each claiming whole segments: each span stored once, memory bounded."""

from __future__ import annotations

import fcntl
import os
import threading
import time
from pathlib import Path

import numpy as np
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from bench.gen import requests
from tests.ingest.ingest_support import request_ids, span_count, stored, stored_ids, write_segment
from tracedag.pipeline.ingest.processes import merge_metrics
from tracedag.pipeline.ingest.segments import LEFTOVER_SECONDS, SpoolConverter, claim
from tracedag.pipeline.store.dedupe import DedupeIndex

NOW = time.time_ns()


def _reqs(n_spans: int, seed: int) -> list[ExportTraceServiceRequest]:
    return list(requests(n_spans, seed))


def test_two_converters_claim_each_segment_once_and_retried_spans_are_stored_once(data: Path) -> None:
    reqs = _reqs(3000, 11)
    bodies = [(r.SerializeToString(), NOW) for r in reqs]
    half = len(bodies) // 2
    write_segment(data, 1, bodies[:half])
    write_segment(data, 2, bodies[half:])
    write_segment(data, 3, bodies[:half])  # retries of segment 1's exports, seen by the other shard
    write_segment(data, 4, bodies)
    shards = [SpoolConverter(data, shard=(w, 2), chunk_spans=512) for w in range(2)]
    stats = []
    threads = [threading.Thread(target=lambda c=c: stats.append(c.run_once())) for c in shards]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    n = sum(span_count(r) for r in reqs)
    assert stored(data) == (n, n)
    assert stored_ids(data) == request_ids(reqs)
    assert sum(s.spans_stored for s in stats) == n
    assert sum(s.segments for s in stats) == 4  # every segment converted once, by one of the two
    assert sum(s.duplicates for s in stats) == n + sum(span_count(r) for r in reqs[:half])
    assert sum(s.conflicts for s in stats) == 0
    assert not list((data / "spool").glob("*.sealed"))


def test_a_segment_claimed_by_another_converter_is_left_to_it(data: Path) -> None:
    reqs = _reqs(600, 15)
    seg1 = write_segment(data, 1, [(r.SerializeToString(), NOW) for r in reqs[:2]])
    write_segment(data, 2, [(r.SerializeToString(), NOW) for r in reqs[2:]])
    held = claim(seg1)  # another converter is converting segment 1
    assert held is not None and claim(seg1) is None
    st = SpoolConverter(data, shard=(1, 2)).run_once()
    assert st.segments == 1 and seg1.exists()  # it took segment 2 and left segment 1 alone
    held.close()  # that converter died: the kernel dropped its lock
    assert SpoolConverter(data, shard=(1, 2)).run_once().segments == 1
    assert stored_ids(data) == request_ids(reqs)


def test_a_segment_retired_while_being_claimed_is_not_claimed(data: Path, monkeypatch) -> None:
    seg = write_segment(data, 1, [(r.SerializeToString(), NOW) for r in _reqs(200, 16)])
    done = data / "spool" / "done"
    done.mkdir(exist_ok=True)
    real_flock = fcntl.flock

    def retired_first(fd: int, op: int) -> None:  # the converter that held it retires it and lets go
        if seg.exists():
            seg.rename(done / seg.name)
        real_flock(fd, op)

    monkeypatch.setattr(fcntl, "flock", retired_first)
    assert claim(seg) is None  # the lock was free, but on a file already converted
    monkeypatch.undo()
    assert claim(seg) is None  # and once it is gone from the spool, it cannot be opened


def test_a_shard_sees_files_the_other_wrote_after_its_index_was_built(data: Path) -> None:
    reqs = _reqs(800, 12)
    bodies = [(r.SerializeToString(), NOW) for r in reqs]
    even, odd = SpoolConverter(data, shard=(0, 2)), SpoolConverter(data, shard=(1, 2))
    write_segment(data, 2, bodies[:3])
    even.run_once()  # the even shard's index now exists
    write_segment(data, 1, bodies)
    odd.run_once()
    write_segment(data, 4, bodies)  # all already stored by the odd shard
    st = even.run_once()
    assert (st.spans_stored, st.duplicates) == (0, sum(span_count(r) for r in reqs))
    n = sum(span_count(r) for r in reqs)
    assert stored(data) == (n, n)


def test_dedupe_index_keeps_at_most_max_keys_and_forgets_the_oldest() -> None:
    index = DedupeIndex(window_hours=48, max_keys=1000)
    rng = np.random.default_rng(1)
    batches = [rng.integers(1, 2**63, 400, dtype=np.uint64) for _ in range(6)]
    for i, keys in enumerate(batches):
        index.add(f"2026-01-01-{i // 2:02d}", keys, keys)
    assert len(index) <= 1000
    assert not index.check(batches[-1], batches[-1]).keep.any()  # the newest are remembered
    assert index.check(batches[0], batches[0]).keep.all()  # the oldest were forgotten


def test_converter_metrics_of_several_processes_are_summed() -> None:
    a = "# HELP x_total X.\n# TYPE x_total counter\nx_total 3\ny{k=\"v\"} 1.5\n"
    b = "# HELP x_total X.\n# TYPE x_total counter\nx_total 4\ny{k=\"v\"} 1\n"
    assert merge_metrics([a, b]) == "# HELP x_total X.\n# TYPE x_total counter\nx_total 7\ny{k=\"v\"} 2.5\n"
    assert merge_metrics([a]) == a and merge_metrics([]) == ""


def test_staged_leftovers_of_a_crash_are_removed_at_start(data: Path) -> None:
    for d in ("convert-0", "convert-1", "convert-3"):
        (data / "state" / d).mkdir(parents=True, exist_ok=True)
        (data / "state" / d / "seg-00000000000000000009.parquet.tmp").write_bytes(b"partial")
    write_segment(data, 2, [(r.SerializeToString(), NOW) for r in _reqs(200, 14)])
    SpoolConverter(data, shard=(0, 2)).run_once()
    assert not list((data / "state" / "convert-0").iterdir())
    assert not list((data / "state" / "convert-3").iterdir())  # no shard 3 any more
    assert list((data / "state" / "convert-1").iterdir())  # shard 1 may be staging right now
    assert stored(data)[0] == sum(span_count(r) for r in _reqs(200, 14))


def test_a_converter_starting_leaves_the_temp_files_other_stages_are_writing(data: Path) -> None:
    """A live collector's converter starts beside its first round (or beside ``tracedag score``): it removed every
    ``tables/**/*.tmp`` as a crash's, and a scorer's ``step_scores`` file died between its write and its rename
    (a CI run: FileNotFoundError in write_atomic_stream). Spans temp files and other tables' old ones still go."""
    tables = data / "tables"
    writing = tables / "step_scores" / "part-1.parquet.tmp"
    crashed = tables / "dag_nodes" / "build-1-0000.parquet.tmp"
    spans = tables / "spans" / "spans-1.parquet.tmp"
    for f in (writing, crashed, spans):
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"partial")
    gone = time.time() - LEFTOVER_SECONDS - 60
    os.utime(crashed, (gone, gone))
    write_segment(data, 2, [(r.SerializeToString(), NOW) for r in _reqs(100, 15)])
    SpoolConverter(data).run_once()
    assert writing.exists()  # being written: its writer renames it
    assert not crashed.exists() and not spans.exists()
    assert stored(data)[0] == sum(span_count(r) for r in _reqs(100, 15))
