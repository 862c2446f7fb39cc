"""Crash points c-f of RELIABILITY.md E38: the converter process dies (``os._exit(137)``) and restarts.

After every restart each span is stored exactly once, no temp file is visible and every Parquet
file opens in DuckDB. The crashes happen in child processes (the fault points exit the process); the
restart that must then recover is a new ``SpoolConverter`` in the test's process, which reads only what
the dead child left on disk (a child process more per test cost ~0.5 s of CPU for its imports alone).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from functools import cache
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from bench.gen import requests
from tests.ingest.ingest_support import ROOT, request_ids, stored, stored_ids, write_segment
from tracedag.pipeline.ingest.segments import SpoolConverter

_CHILD = """
import sys
from tracedag.pipeline.ingest.segments import SpoolConverter
conv = SpoolConverter(sys.argv[1], compact_interval=1e9)
conv.run_once()
if len(sys.argv) > 2:
    conv.compact(now_unix=float(sys.argv[2]))
"""

HOUR = 3600 * 10**9


def _run(data: Path, fault: str = "", skip: int = 0, compact_at: float | None = None) -> int:
    env = dict(os.environ, TRACEDAG_FAULT=fault, TRACEDAG_FAULT_SKIP=str(skip), PYTHONPATH=str(ROOT))
    args = [sys.executable, "-c", _CHILD, str(data)] + ([str(compact_at)] if compact_at else [])
    return subprocess.run(args, env=env, timeout=120, capture_output=True).returncode


def _convert_here(data: Path, compact_at: float | None = None) -> None:
    """A converter started afresh on what the crashed process left, as the child would run it (exit 0)."""
    conv = SpoolConverter(data, compact_interval=1e9)
    conv.run_once()
    if compact_at is not None:
        conv.compact(now_unix=compact_at)


@cache
def _requests() -> tuple[ExportTraceServiceRequest, ...]:
    """Generated once per module: 4 segments' worth of 2 requests of 512 spans (written anew per test)."""
    return tuple(requests(512 * 2 * 4, seed=21))


def _segments(data: Path, n: int, received: int) -> set[tuple[str, str]]:
    reqs = list(_requests())
    for i in range(n):
        write_segment(data, 100 + i, [(r.SerializeToString(), received) for r in reqs[2 * i : 2 * i + 2]])
    return request_ids(reqs[: 2 * n])


def _check_consistent(data: Path) -> None:
    files = list((data / "tables").rglob("*.parquet"))
    for f in files:
        pq.read_metadata(f)  # every visible file is complete
    rows, distinct = stored(data) if files else (0, 0)
    assert rows == distinct


@pytest.mark.parametrize(("point", "skip"), [("convert.before_rename", 0), ("convert.before_rename", 2),
                                             ("convert.after_rename", 0), ("convert.after_rename", 1)])
def test_crash_during_conversion_then_restart_stores_each_span_once(data: Path, point: str, skip: int) -> None:
    ids = _segments(data, 3, time.time_ns())
    assert _run(data, point, skip) == 137
    _check_consistent(data)
    _convert_here(data)
    assert stored_ids(data) == ids and stored(data) == (len(ids), len(ids))
    assert not list((data / "tables").rglob("*.tmp"))
    assert not list((data / "spool").glob("*.sealed"))


def test_crash_during_recovery_then_restart_stores_each_span_once(data: Path) -> None:
    ids = _segments(data, 3, time.time_ns())
    assert _run(data, "convert.after_rename", 1) == 137  # crash (d), leaving a backlog
    assert _run(data, "recovery") == 137  # (f) crash again while recovering
    _check_consistent(data)
    _convert_here(data)
    assert stored(data) == (len(ids), len(ids)) and stored_ids(data) == ids


def test_crash_in_the_middle_of_compaction_keeps_the_partition_whole(data: Path) -> None:
    ids = _segments(data, 4, time.time_ns() - 3 * HOUR)
    _convert_here(data)
    part = next((data / "tables" / "spans").iterdir())
    before = sorted(p.name for p in part.glob("*.parquet"))
    assert len(before) == 4
    assert _run(data, "compact.middle", compact_at=time.time()) == 137  # (e)
    assert sorted(p.name for p in part.glob("*.parquet")) == before  # the old state, whole
    _check_consistent(data)
    _convert_here(data, compact_at=time.time())
    assert len(list(part.glob("*.parquet"))) == 1
    assert stored(data) == (len(ids), len(ids)) and stored_ids(data) == ids
    assert not (data / "state" / "compact").exists() or not any((data / "state" / "compact").rglob("*.parquet"))
