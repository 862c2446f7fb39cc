"""Compaction: few files per hour, duplicates removed, readers never see partial or double data (H70)."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

import duckdb
import numpy as np
import pyarrow.parquet as pq

from bench.gen import requests
from tests.ingest.ingest_support import request_ids, stored, stored_ids, write_segment
from tracedag.pipeline.convert.records import convert_records
from tracedag.pipeline.ingest.segments import SpoolConverter
from tracedag.pipeline.ingest.writer import hour_of
from tracedag.pipeline.store.compact import Compactor, hour_closed
from tracedag.pipeline.store.dedupe import write_sidecar
from tracedag.pipeline.store.parquet import write_atomic
from tracedag.pipeline.store.views import connect

HOUR = 3600 * 10**9


def _closed_hour_of_segments(data: Path, spans: int, seed: int) -> tuple[list, int]:
    """One spool segment per generated request, all received 3 hours ago; returns (requests, receive time)."""
    reqs = list(requests(spans, seed=seed))
    received = time.time_ns() - 3 * HOUR
    for i, r in enumerate(reqs):
        write_segment(data, i + 1, [(r.SerializeToString(), received)])
    return reqs, received


def test_hour_closed_after_the_hour_and_a_grace_period() -> None:
    now = time.time()
    assert hour_closed(hour_of(int((now - 7200) * 1e9)), now)
    assert not hour_closed(hour_of(int(now * 1e9)), now)


def test_closed_hour_of_many_small_files_becomes_one_file(data: Path) -> None:
    reqs, received = _closed_hour_of_segments(data, 512 * 12, seed=31)
    conv = SpoolConverter(data, compact_interval=1e9)
    conv.run_once()
    part = next((data / "tables" / "spans").iterdir())
    assert len(list(part.glob("*.parquet"))) == len(reqs)
    st = conv.compact()
    assert st.partitions == 1 and st.files_before == len(reqs)
    assert len(list(part.glob("*.parquet"))) == 1
    assert stored_ids(data) == request_ids(reqs)
    # the dedupe index still knows the compacted spans (a retry after compaction is dropped)
    write_segment(data, 999, [(reqs[0].SerializeToString(), received)])
    assert SpoolConverter(data).run_once().duplicates == 512


def test_the_open_hour_is_compacted_only_past_the_file_limit(data: Path) -> None:
    reqs = list(requests(512 * 6, seed=32))
    for i, r in enumerate(reqs):
        write_segment(data, i + 1, [(r.SerializeToString(), time.time_ns())])
    conv = SpoolConverter(data, compact_interval=1e9)
    conv.run_once()
    assert conv.compact().partitions == 0
    conv.compactor.max_open_files = 4
    assert conv.compact().partitions == 1
    assert stored(data) == (512 * 6, 512 * 6)


def test_compaction_removes_duplicates_that_escaped_the_window(data: Path) -> None:
    reqs = list(requests(1024, seed=33))
    part = data / "tables" / "spans" / f"recv_hour={hour_of(time.time_ns() - 5 * HOUR)}"
    for name in ("a", "b"):  # the same spans written twice, as a too-small window would let through
        conv = convert_records([(r.SerializeToString(), time.time_ns() - 5 * HOUR) for r in reqs], name)
        path = write_atomic(conv.table, part / f"{name}.parquet")
        write_sidecar(path, conv.keys, conv.content)
    assert stored(data) == (2048, 1024)
    st = Compactor(data).run(contextlib.nullcontext)
    assert st.duplicates == 1024
    assert stored(data) == (1024, 1024)
    assert connect(data).execute("select distinct batch_id from spans").fetchall() == [("a",)]


def _count_loop(data: Path, stop: threading.Event, seen: list[tuple[int, int]], errors: list[str]) -> None:
    con = connect(data)
    while not stop.is_set():
        try:
            row = con.execute("select count(*), count(distinct (trace_id, span_id)) from spans").fetchone()
        except duckdb.IOException as exc:  # a file listed just before a swap and opened after it
            errors.append(str(exc))
            continue
        assert row is not None
        seen.append((int(row[0]), int(row[1])))
        time.sleep(0.002)  # let the writer thread run


def test_h70_concurrent_counts_never_see_partial_or_double_data(data: Path) -> None:
    reqs = list(requests(512 * 12, seed=34))
    received = time.time_ns() - 3 * HOUR
    write_segment(data, 1, [(reqs[0].SerializeToString(), received)])
    conv = SpoolConverter(data, compact_interval=1e9)
    conv.run_once()
    stop, seen, errors = threading.Event(), [], []
    reader = threading.Thread(target=_count_loop, args=(data, stop, seen, errors))
    reader.start()
    try:
        for i, r in enumerate(reqs[1:], start=2):  # a new small file, then a compaction, 11 times
            write_segment(data, i, [(r.SerializeToString(), received)])
            conv.run_once()
            conv.compact()
    finally:
        stop.set()
        reader.join()
    valid = {512 * k for k in range(1, len(reqs) + 1)}
    assert seen, "the reader never completed a query"
    assert all(rows == distinct for rows, distinct in seen), "double counting"
    assert {rows for rows, _ in seen} <= valid, "a partial file was visible"
    assert np.all(np.diff([rows for rows, _ in seen]) >= 0), "a count went down"
    print(f"H70: {len(seen)} queries, {len(errors)} retried after a swap")
    assert len(errors) <= max(2, len(seen) // 10), errors[:3]
    assert stored(data) == (512 * len(reqs), 512 * len(reqs))


def test_files_written_while_merging_survive_the_swap(data: Path) -> None:
    reqs = list(requests(512 * 6, seed=35))
    received = time.time_ns() - 3 * HOUR
    for i, r in enumerate(reqs[:5]):
        write_segment(data, i + 1, [(r.SerializeToString(), received)])
    conv = SpoolConverter(data, compact_interval=1e9)
    conv.run_once()

    @contextlib.contextmanager
    def critical():  # a converter stores one more segment after the merge, before the swap
        write_segment(data, 99, [(reqs[5].SerializeToString(), received)])
        conv.run_once()
        with conv.writer.locked():
            yield

    st = conv.compactor.run(critical)
    part = next((data / "tables" / "spans").iterdir())
    assert st.partitions == 1 and len(list(part.glob("*.parquet"))) == 2
    assert stored_ids(data) == request_ids(reqs)


def test_compaction_yields_to_conversion_but_not_forever(data: Path) -> None:
    reqs = list(requests(512 * 6, seed=33))
    received = time.time_ns() - 3 * HOUR  # a closed hour: due as soon as it has small files
    for i, r in enumerate(reqs[:4]):
        write_segment(data, i + 1, [(r.SerializeToString(), received)])
    conv = SpoolConverter(data, compact_interval=3600.0)
    part_files = lambda: list(next((data / "tables" / "spans").iterdir()).glob("*.parquet"))  # noqa: E731
    conv._last_compact = time.monotonic() - 3601.0  # due
    assert conv.run_once().segments == 4
    assert len(part_files()) == 4  # converting: compaction waited
    assert conv.run_once().segments == 0
    assert len(part_files()) == 1  # caught up: compacted
    conv._last_compact = time.monotonic() - 10 * 3600.0  # deferred for the longest allowed
    write_segment(data, 5, [(reqs[4].SerializeToString(), received)])
    write_segment(data, 6, [(reqs[5].SerializeToString(), received)])
    assert conv.run_once().segments == 2
    assert len(part_files()) == 1  # compacted although this round converted (overload must not defer it forever)
    assert stored(data) == (512 * 6, 512 * 6)


def test_merged_files_have_bounded_row_groups_and_sidecars_that_match_their_rows(data: Path) -> None:
    from tracedag.pipeline.store.dedupe import keys_from_hex, read_sidecar

    reqs, received = _closed_hour_of_segments(data, 512 * 10, seed=35)
    write_segment(data, 100, [(reqs[3].SerializeToString(), received)])  # a duplicate file's worth
    conv = SpoolConverter(data, compact_interval=1e9, chunk_spans=200)  # several row groups per file
    conv.run_once()
    part = next((data / "tables" / "spans").iterdir())
    conv.compactor.target_rows = 2000  # several output files: each sidecar must describe its own rows
    import tracedag.pipeline.store.compact as compact

    real = compact._Merger.__init__
    compact._Merger.__init__ = lambda self, out, target, dedupe, **kw: real(self, out, target, dedupe, group_rows=700, **kw)
    try:
        st = conv.compact()
    finally:
        compact._Merger.__init__ = real
    assert st.partitions == 1
    files = sorted(part.glob("*.parquet"))
    assert len(files) >= 3
    for f in files:
        pf = pq.ParquetFile(f)
        assert all(pf.metadata.row_group(g).num_rows <= 700 + 600 for g in range(pf.num_row_groups))
        ids = pf.read(columns=["trace_id", "span_id"])
        keys, _ = read_sidecar(f)
        assert keys.tolist() == keys_from_hex(ids.column("trace_id"), ids.column("span_id")).tolist()
    assert stored(data) == (512 * 10, 512 * 10)


def test_converter_zero_drops_its_index_for_a_compaction_and_reloads_it_after(data: Path) -> None:
    reqs, received = _closed_hour_of_segments(data, 512 * 6, seed=36)
    conv = SpoolConverter(data, compact_interval=0.0)
    conv.run_once()  # converts, then (caught up on the next round) compacts
    conv.run_once()
    assert len(list(next((data / "tables" / "spans").iterdir()).glob("*.parquet"))) == 1
    write_segment(data, 99, [(reqs[2].SerializeToString(), received)])
    st = conv.run_once()  # the index came back from the compacted file's sidecar
    assert (st.duplicates, st.spans_stored) == (512, 0)
