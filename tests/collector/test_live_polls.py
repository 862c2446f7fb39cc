"""Issue #31: after each score round the live collector computes the rows of the traces waiting to be stored for the
queries a reader polled lately, and writes them where every process reads them (``store.mixedfile``): a poll then
computes nothing, and answers what the SQL over the whole store does. A real collector on loopback and the real SDK's
exporter; the only change to the code under test holds the store's passes after the first two traces are stored, so
later traces wait."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.collector.collector_support import wait_until
from tests.collector.test_live_analysis import _agent_trace, _root_causes, _state
from tests.queries.test_materialized import _exact, references
from tests.store.test_mixed_kept import Computed
from tracedag.pipeline import service
from tracedag.pipeline.service import CollectorConfig, start_collector
from tracedag.pipeline.store import mixedfile, mixedkept
from tracedag.pipeline.store.querying import run_named


def _written(data: Path) -> set[str]:
    """The traces with rows in the collector's rows files."""
    found: set[str] = set()
    for path in (data / "state" / mixedfile.DIR).glob("*.arrow"):
        loaded = mixedfile.loaded(path)
        if loaded is not None:
            found.update(loaded.table.column("trace_id").to_pylist())
    return found


def test_the_collector_writes_the_waiting_rows_of_a_polled_query_and_a_poll_computes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    held, real = threading.Event(), service.RunningCollector.store_once
    monkeypatch.setattr(service.RunningCollector, "store_once", lambda self: 0 if held.is_set() else real(self))
    mixedkept.forget()
    c = start_collector(CollectorConfig(data=data, http_port=0, grpc_port=0, build=True, build_interval=0.2,
                                        build_grace_seconds=0.3, build_idle_seconds=120))
    try:
        endpoint = f"http://127.0.0.1:{c.http_port}/v1/traces"
        stored = {_agent_trace(endpoint), _agent_trace(endpoint)}  # half the traces at least: the stored rows answer
        wait_until(lambda: stored <= _state(data), 90, "the first traces were never stored")
        held.set()
        second = _agent_trace(endpoint)
        wait_until(lambda: second in _root_causes(data), 90, "the second trace's root cause never showed")
        assert second not in _state(data) and not _written(data)  # it waits; nobody polled before its round
        third = _agent_trace(endpoint)  # polled now: the collector writes the rows after the third's round
        wait_until(lambda: {second, third} <= _written(data), 90, "the collector never wrote the waiting rows")
        mixedkept.forget()  # another process's poll
        computed = Computed(monkeypatch)
        got = _exact(run_named(data, "root_causes").to_pylist())
        assert computed.times == 0
        assert got == references(data, [("root_causes", {})])[0] and {second, third} <= {r["trace_id"] for r in got}
    finally:
        c.stop(2)
        mixedkept.forget()
