"""Issue #31: the live store (``score.live_store``) in a collector's thread of its own: a stop in the middle of a
pass writes nothing of it, and a failing pass is logged and retried with a growing pause, its half-written rows
left to the collection. Real collectors on loopback, real exporters, real Parquet and DuckDB; the only change to
the code under test is a wrapper that holds or fails a step of a pass at a chosen moment."""

from __future__ import annotations

import contextlib
import logging
import threading
import time

from tests.collector.collector_support import wait_until
from tests.collector.test_live_analysis import _agent_trace, _root_causes, _sql_answers_equal, _state
from tracedag.pipeline.dag.build import build_store
from tracedag.pipeline.score import live_store
from tracedag.pipeline.score import materialize as mat_writer
from tracedag.pipeline.service import Backoff, CollectorConfig, start_collector
from tracedag.pipeline.store import materialized
from tracedag.pipeline.store.querying import run_sql

RESULTS = tuple(materialized.table_name(n) for n in materialized.SPECS)


def _live(data, **kw) -> object:
    return start_collector(CollectorConfig(data=data, http_port=0, grpc_port=0, build=True, build_interval=0.2,
                                           build_grace_seconds=0.3, build_idle_seconds=120, **kw))


def _rows(data) -> dict[str, int]:
    """Rows of each stored result table (0 for a table without files)."""
    out = {}
    for t in RESULTS:
        try:
            out[t] = run_sql(data, f"select count(*) as n from {t}").column("n")[0].as_py()
        except Exception:  # no round stored yet: the view does not exist
            out[t] = 0
    return out


def _orphans(data) -> int:
    """Rows of the result tables whose round no state row names."""
    total = 0
    for t in RESULTS:
        with contextlib.suppress(Exception):  # no round stored yet: the views do not exist
            total += run_sql(data, f"select count(*) as n from {t} where mat_round not in "
                                   f"(select mat_round from {materialized.STATE})").column("n")[0].as_py()
    return total


def test_a_stop_in_the_middle_of_a_pass_writes_nothing_of_it_and_the_next_collector_stores_it(tmp_path, monkeypatch):
    data = tmp_path / "data"
    computing, real = threading.Event(), live_store.LiveStore.compute
    collectors = []

    def held(self, copied):  # the pass has copied its part: it waits here until the collector stops
        computing.set()
        while not collectors[0]._stop.is_set():
            time.sleep(0.02)
        return real(self, copied)

    monkeypatch.setattr(live_store.LiveStore, "compute", held)
    c = _live(data)
    collectors.append(c)
    try:
        trace = _agent_trace(f"http://127.0.0.1:{c.http_port}/v1/traces")
        assert computing.wait(60), "no pass of the store started"
        assert _root_causes(data)[trace] == "get_weather"  # queryable from the SQL meanwhile
    finally:
        c.stop(2)
    assert not c._threads[-1].is_alive()  # the store's thread ended with the collector
    assert trace not in _state(data) and _rows(data) == dict.fromkeys(RESULTS, 0)  # nothing of the pass
    monkeypatch.setattr(live_store.LiveStore, "compute", real)
    c = _live(data)
    try:
        wait_until(lambda: trace in _state(data), 60, "the next collector never stored the trace")
        _sql_answers_equal(data)
    finally:
        c.stop(2)
    assert _orphans(data) == 0


def test_a_failing_pass_is_logged_retried_with_a_growing_pause_and_its_rows_left_to_the_collection(
        tmp_path, monkeypatch, caplog):
    data = tmp_path / "data"
    calls: list[float] = []
    real = mat_writer._write_state

    def failing(where, state):  # the results are written, the state is not: the disk filled up
        calls.append(time.monotonic())
        if len(calls) <= 2:
            raise OSError(28, "No space left on device (test)")
        real(where, state)

    monkeypatch.setattr(mat_writer, "_write_state", failing)
    caplog.set_level(logging.INFO, logger="tracedag.pipeline.service")
    c = _live(data)
    try:
        trace = _agent_trace(f"http://127.0.0.1:{c.http_port}/v1/traces")
        wait_until(lambda: trace in _state(data), 90, "the store never recovered")
        _sql_answers_equal(data)
    finally:
        c.stop(2)
    assert len(calls) == 3
    assert calls[1] - calls[0] >= 1.0 and calls[2] - calls[1] >= 2.0  # Backoff: 1 s, then 2 s
    said = [r.getMessage() for r in caplog.records if "storing the named queries' results" in r.getMessage()]
    assert len(said) == 2, said  # the failure once (the same again is not repeated), then working again
    assert "No space left on device (test)" in caplog.text and "working again after 2 failed round(s)" in said[1]
    assert _orphans(data) > 0  # the two failed passes' rows, which no reader takes
    build_store(data, idle_seconds=120, compact=True)  # a collection (the collector's, or tracedag build --compact)
    assert _orphans(data) == 0
    _sql_answers_equal(data)


def test_backoff_doubles_up_to_its_most_and_restarts_once_it_works():
    b = Backoff(first=1.0, most=5.0)
    assert [b.failed() for _ in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    b.succeeded()
    assert b.failed() == 1.0
