"""Stores and engines for the Ray engine tests: generated spans, a local Ray cluster, a pausing task.

``make_spans(data)`` ingests generated agent traces (``bench/gen.py``) in two arrivals three hours
apart, so a build has two received-time windows. ``PausingEngine`` is the real Ray engine whose
first attempt of bucket 0 records its pid and waits, so that a test can kill its worker.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.gen import requests
from tracedag.pipeline.engine import Engine
from tracedag.pipeline.ingest.direct import ingest_requests
from tracedag.pipeline.store.shared_macros import calls_shared_macros
from tracedag.pipeline.store.views import connect

HOUR = 3600 * 10**9
T0 = 1_764_460_800_000_000_000


def make_spans(data: Path, spans: int = 6000) -> int:
    """Two arrivals of generated traces (seeds 1 and 2), received three hours apart."""
    n = ingest_requests(data, requests(spans // 2, seed=1), received_unix_nano=T0)
    return n + ingest_requests(data, requests(spans // 2, seed=2), received_unix_nano=T0 + 3 * HOUR)


def spans_copy(source: Path, target: Path) -> Path:
    """A store holding the spans of ``source`` only (nothing built or scored)."""
    shutil.copytree(source / "tables" / "spans", target / "tables" / "spans")
    return target


def rows(data: Path, sql: str) -> list[tuple[Any, ...]]:
    con = connect(data, shared_macros=calls_shared_macros(sql))  # as tests/dag/spanbuild.q
    try:
        return con.sql(sql).fetchall()
    finally:
        con.close()


def table_rows(data: Path, table: str, exclude: str) -> list[tuple[Any, ...]]:
    """Every row of a view without the columns that name the run (build id, build or score time)."""
    return rows(data, f"select * exclude ({exclude}) from {table} order by all")


def pause_first(fn: Callable[..., Any], pause_dir: str, item: Any, *args: Any) -> Any:
    """Run ``fn(item, *args)``; the first attempt of bucket 0 writes its pid to ``paused`` and waits for ``go``."""
    d = Path(pause_dir)
    with open(d / "attempts", "a", encoding="utf-8") as f:
        f.write(f"{item.index} {os.getpid()}\n")
    if item.index == 0 and not (d / "paused").exists():
        tmp = d / "paused.tmp"
        tmp.write_text(str(os.getpid()), encoding="utf-8")
        tmp.rename(d / "paused")
        while not (d / "go").exists():
            time.sleep(0.05)
    return fn(item, *args)


@dataclass
class PausingEngine(Engine):
    """The Ray engine, with ``pause_first`` around every task."""

    pause_dir: str = ""

    def map_buckets(self, fn: Callable[..., Any], items: Sequence[Any], *args: Any) -> Iterator[tuple[int, Any]]:
        pause_dir = self.pause_dir

        def paused(item: Any, *rest: Any) -> Any:
            return pause_first(fn, pause_dir, item, *rest)

        return super().map_buckets(paused, items, *args)
