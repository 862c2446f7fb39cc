"""Queries through the query layer re-run when compaction swapped files under them (H70)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import duckdb
import pytest

from bench.gen import requests
from tests.ingest.ingest_support import write_segment
from tracedag.pipeline.ingest.segments import SpoolConverter
from tracedag.pipeline.store.files import file_vanished
from tracedag.pipeline.store.querying import run_sql

HOUR = 3600 * 10**9


def test_a_vanished_file_is_recognised_from_the_real_duckdb_error(tmp_path: Path) -> None:
    path = tmp_path / "x.parquet"
    duckdb.sql("copy (select 1 as a) to '" + str(path) + "' (format parquet)")
    con = duckdb.connect()
    con.execute(f"create view v as select * from read_parquet(['{path}'])")
    path.unlink()
    with pytest.raises(duckdb.IOException) as info:
        con.execute("select count(*) from v").fetchall()
    assert file_vanished(info.value)


def _loop(data: Path, stop: threading.Event, seen: list[int], errors: list[str]) -> None:
    while not stop.is_set():
        try:
            seen.append(int(run_sql(data, "select count(*) as n from spans").column("n")[0].as_py()))
        except Exception as exc:  # recorded and asserted on below
            errors.append(repr(exc))


def test_queries_never_fail_while_compaction_swaps_partitions(tmp_path: Path) -> None:
    data = tmp_path / "data"
    reqs = list(requests(512 * 10, seed=36))
    received = time.time_ns() - 3 * HOUR
    write_segment(data, 1, [(reqs[0].SerializeToString(), received)])
    conv = SpoolConverter(data, compact_interval=1e9)
    conv.run_once()
    stop, seen, errors = threading.Event(), [], []
    reader = threading.Thread(target=_loop, args=(data, stop, seen, errors))
    reader.start()
    try:
        for i, r in enumerate(reqs[1:], start=2):
            write_segment(data, i, [(r.SerializeToString(), received)])
            conv.run_once()
            conv.compact()
    finally:
        stop.set()
        reader.join()
    assert seen and not errors, errors[:3]
    assert set(seen) <= {512 * k for k in range(1, len(reqs) + 1)}
