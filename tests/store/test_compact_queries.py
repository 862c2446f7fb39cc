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
from tracedag.pipeline.store.files import file_vanished, rerun_if_vanished
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


def test_a_read_that_met_a_vanished_file_is_planned_again_and_other_errors_are_raised_at_once(tmp_path: Path) -> None:
    """What a scorer beside a compacting build does (``score.runner``): a read that listed a file a swap removed
    runs again and lists the files there now; any other error, or a file still gone after every attempt, is
    raised as DuckDB gave it."""
    old, new = tmp_path / "old.parquet", tmp_path / "new.parquet"
    duckdb.sql(f"copy (select 7 as a) to '{new}' (format parquet)")
    con = duckdb.connect()
    plans: list[str] = []

    def read() -> int:  # the first plan names a file the swap removed; the next lists the directory
        plans.append(f"read_parquet(['{old}'])" if not plans else f"read_parquet('{tmp_path}/*.parquet')")
        return int(con.execute(f"select sum(a) from {plans[-1]}").fetchone()[0])

    assert rerun_if_vanished(read) == 7 and len(plans) == 2
    with pytest.raises(duckdb.IOException, match="old.parquet"):
        rerun_if_vanished(lambda: con.execute(f"select * from read_parquet(['{old}'])").fetchall(), attempts=3)
    calls: list[int] = []

    def broken() -> None:
        calls.append(1)
        con.execute("select * from no_such_table")

    with pytest.raises(duckdb.CatalogException):
        rerun_if_vanished(broken)
    assert calls == [1]


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
