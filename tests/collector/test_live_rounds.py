"""Issue #31: the store's pass copies its part's spans without holding the rounds back. Real collectors on
loopback, the real SDK exporter, real builds, Parquet and DuckDB; the only change to the code under test is a
wrapper that holds the spans copy of a pass at a chosen moment."""

from __future__ import annotations

import threading

from tests.collector.test_live_analysis import (
    _round_with_a_trace,
    _sql_answers_equal,
    _state,
)
from tracedag.pipeline.score import live_store
from tracedag.pipeline.service import CollectorConfig, start_collector


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
