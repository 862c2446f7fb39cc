"""Issue #31: the live rounds' cadence. Rounds start ``build_interval`` seconds apart; a round longer than that is
followed after a short gap (``ROUND_GAP_SECONDS``), not after another interval, so the traces that became complete
during a long round wait less for theirs. Real collectors on loopback, real builds and scores; the only change to
the code under test is a wrapper that makes each round last a chosen time before it runs."""

from __future__ import annotations

import threading
import time

from tests.collector.collector_support import wait_until
from tests.collector.test_live_analysis import _agent_trace, _root_causes
from tracedag.pipeline import service
from tracedag.pipeline.service import ROUND_GAP_SECONDS, CollectorConfig, next_round_wait, start_collector


def test_the_wait_after_a_round_counts_from_its_start():
    assert next_round_wait(1.0, 0.25) == 0.75
    assert next_round_wait(1.0, 0.0) == 1.0
    assert next_round_wait(1.0, 1.0) == ROUND_GAP_SECONDS  # a long round: only the gap
    assert next_round_wait(1.0, 7.5) == ROUND_GAP_SECONDS
    assert next_round_wait(0.05, 0.01) == 0.05  # an interval below the gap: the interval after each round, as before
    assert next_round_wait(0.05, 1.0) == 0.05
    assert next_round_wait(0.0, 1.0) == 0.0


def test_rounds_start_an_interval_apart_or_at_once_after_a_longer_one(tmp_path, monkeypatch):
    """A 1 s interval. Four rounds of ~1.2 s: the next starts after the gap, where it started a second later
    before. Then four of ~0.3 s: they still start a second apart (their fixed cost is paid no more often), where a
    round's length was added to the second before."""
    lasting = [1.2] * 4 + [0.3] * 4
    starts: list[float] = []
    enough = threading.Event()
    real = service.RunningCollector.analyze_once

    def timed(self):
        starts.append(time.monotonic())
        if len(starts) >= len(lasting):
            enough.set()
        time.sleep(lasting[len(starts) - 1] if len(starts) <= len(lasting) else 0.0)
        return real(self)

    monkeypatch.setattr(service.RunningCollector, "analyze_once", timed)
    c = start_collector(CollectorConfig(data=tmp_path / "data", http_port=0, grpc_port=0, build=True,
                                        build_interval=1.0, build_grace_seconds=0.3, build_idle_seconds=120))
    try:
        trace = _agent_trace(f"http://127.0.0.1:{c.http_port}/v1/traces")
        assert enough.wait(120), "the rounds never came"
        wait_until(lambda: trace in _root_causes(c.data), 90, "no root cause while the collector runs")
    finally:
        c.stop(2)
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    long, short = gaps[:3], gaps[4:7]  # gaps[3] follows the last long round
    # each: the round (>= 1.2 s) and the 0.1 s gap; before, 1.2 s + the interval (>= 2.2 s)
    assert all(gap >= 1.2 for gap in long) and min(long) < 2.0, gaps
    assert all(gap >= 0.99 for gap in short) and min(short) < 1.25, gaps


def test_a_starved_store_still_copies_between_back_to_back_rounds(tmp_path, monkeypatch):
    """Rounds longer than the interval follow each other after 0.1 s; a store thread that needs longer than that to
    reach the round lock (here 0.4 s: a starved thread) still copies before the next round, not a round later."""
    from tracedag.pipeline.score import live_store

    events: list[tuple[str, int]] = []
    real_round, real_copy, real_store = (service.RunningCollector.analyze_once, live_store.LiveStore.copy,
                                         service.RunningCollector.store_once)

    def slow_round(self):
        events.append(("round", 0))
        time.sleep(1.2)
        built = real_round(self)
        events.append(("built", built))
        return built

    def copy(self):
        events.append(("copy", 0))
        return real_copy(self)

    def late_store(self):
        if threading.current_thread().name == "live-store":
            time.sleep(0.4)
        return real_store(self)

    monkeypatch.setattr(service.RunningCollector, "analyze_once", slow_round)
    monkeypatch.setattr(service.RunningCollector, "store_once", late_store)
    monkeypatch.setattr(live_store.LiveStore, "copy", copy)
    c = start_collector(CollectorConfig(data=tmp_path / "data", http_port=0, grpc_port=0, build=True,
                                        build_interval=1.0, build_grace_seconds=0.3, build_idle_seconds=120))
    try:
        trace = _agent_trace(f"http://127.0.0.1:{c.http_port}/v1/traces")
        wait_until(lambda: ("built", 1) in events and events[-1][0] == "round", 120, "the trace was never built")
        wait_until(lambda: trace in _root_causes(c.data), 90, "no root cause while the collector runs")
    finally:
        c.stop(2)
    # the first round scores what a new store may have left, the one that built the trace scores it: after each,
    # the store's copy comes before the next round starts
    first = next(k for k, (what, _) in enumerate(events) if what == "built")
    for k in {first, events.index(("built", 1))}:
        assert events[k + 1] == ("copy", 0), events
        assert events[k + 2] == ("round", 0), events
