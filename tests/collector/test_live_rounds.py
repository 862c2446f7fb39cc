"""Issue #31: a live round starts when the earliest pending trace becomes complete (not a fixed interval after the
last round), and the store's pass copies its part's spans without holding the rounds back. Real collectors on
loopback, the real SDK exporter, real builds, Parquet and DuckDB; the only change to the code under test is a
wrapper that holds the spans copy of a pass at a chosen moment."""

from __future__ import annotations

import threading
import time

from tests.collector.test_live_analysis import (
    _agent_trace,
    _root_causes,
    _round_with_a_trace,
    _sql_answers_equal,
    _state,
)
from tracedag.pipeline.dag.build import build_store
from tracedag.pipeline.score import live_store
from tracedag.pipeline.service import ROUND_FLOOR_SECONDS, CollectorConfig, start_collector


def test_the_next_round_starts_when_the_pending_trace_becomes_complete(tmp_path):
    data = tmp_path / "data"
    c = start_collector(CollectorConfig(data=data, http_port=0, grpc_port=0, build=False, build_interval=30.0,
                                        build_grace_seconds=4.0))
    try:
        assert c.next_round_in() == 30.0  # no build yet: the interval
        trace = _agent_trace(f"http://127.0.0.1:{c.http_port}/v1/traces")
        c.flush()
        assert build_store(data, idle_seconds=120, grace_seconds=4.0).traces_built == 0  # seen, inside its grace
        wait = c.next_round_in()
        assert ROUND_FLOOR_SECONDS <= wait <= 4.0, wait  # when its grace ends, not 30 s on
        time.sleep(wait)
        assert c.analyze_once() == 1  # complete at that moment
        assert trace in _root_causes(data)
        assert c.next_round_in() == 30.0  # nothing pending: the interval
    finally:
        c.stop(2)


def test_a_round_that_outlasted_the_pending_traces_grace_is_followed_at_once(tmp_path):
    data = tmp_path / "data"
    c = start_collector(CollectorConfig(data=data, http_port=0, grpc_port=0, build=False, build_interval=30.0,
                                        build_grace_seconds=2.0))
    try:
        _agent_trace(f"http://127.0.0.1:{c.http_port}/v1/traces")
        c.flush()
        assert build_store(data, idle_seconds=120, grace_seconds=2.0).traces_built == 0
        time.sleep(c.next_round_in() + 0.1)  # as a round longer than the grace: the trace is complete already
        assert c.next_round_in() == ROUND_FLOOR_SECONDS
    finally:
        c.stop(2)


def test_a_round_runs_while_the_store_copies_its_parts_spans(tmp_path, monkeypatch):
    """Only the converter writes spans: a pass copies them after releasing the round lock, so a round builds and
    scores meanwhile, and what the pass stores still equals what the SQL computes."""
    data = tmp_path / "data"
    copying, go, real = threading.Event(), threading.Event(), live_store.LiveStore.copy_spans

    def held(self, copied):
        copying.set()
        assert go.wait(60)
        return real(self, copied)

    monkeypatch.setattr(live_store.LiveStore, "copy_spans", held)
    c = start_collector(CollectorConfig(data=data, http_port=0, grpc_port=0, build=False, build_grace_seconds=0.3))
    try:
        first = _round_with_a_trace(c)
        stored: list[int] = []
        store = threading.Thread(target=lambda: stored.append(c.store_once()))
        store.start()
        assert copying.wait(60), "the pass never reached its spans copy"
        second = _round_with_a_trace(c)  # the round lock is free: this round builds and scores now
        go.set()
        store.join(60)
        assert stored == [1] and first in _state(data) and second not in _state(data)
        _sql_answers_equal(data)
        assert c.store_once() == 1 and second in _state(data)
        _sql_answers_equal(data)
    finally:
        go.set()
        c.stop(2)
