"""A trace view the stored rows do not answer runs its named queries on one connection (#31, #33), and its
document is the whole store's reading of the trace: built only (every query from its SQL) and with a later
turn not stored yet (``store.mixed``), on conversations of several turns (``turn_index`` reads the others)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import pytest

from tests.score.score_support import StoreBuilder, agent_turn
from tracedag.pipeline.dag.build import build_store
from tracedag.pipeline.score import score_store
from tracedag.pipeline.serve import encode
from tracedag.pipeline.serve.data import Store
from tracedag.pipeline.store import querying

TRACES = ("a0", "a1", "a2", "x1")


def _whole(data: Path, tid: str) -> dict[str, Any]:
    """The document of ``tid`` from the named queries over every trace (``documents`` without narrowing)."""
    doc: dict[str, Any] = json.loads(encode.dumps(Store(data).documents([tid])[tid]))
    return doc


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the connections ``querying`` makes (the real ``connect`` makes each)."""
    made: list[int] = []
    real = querying.connect

    def counted(*args: Any, **kwargs: Any) -> duckdb.DuckDBPyConnection:
        made.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(querying, "connect", counted)
    return made


def _assert_views_whole(data: Path, monkeypatch: pytest.MonkeyPatch, connections: int) -> dict[str, Any]:
    """Each trace's view equals the whole store's reading, and makes at most ``connections``; return the readings."""
    wants = {tid: _whole(data, tid) for tid in TRACES}
    made = _counting(monkeypatch)
    store = Store(data)
    store.trace_ids()
    for tid in TRACES:
        before = len(made)
        assert store.trace(tid) == wants[tid], tid
        assert len(made) - before <= connections, tid
    return wants


def test_a_built_stores_trace_view_is_the_whole_stores_on_one_connection(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    StoreBuilder(data).spans(agent_turn("a1", "conv-1", 1_000_000, "search") + agent_turn("x1", "conv-2", 2_000_000, "fetch")
                             + agent_turn("a2", "conv-1", 3_000_000, "lookup") + agent_turn("a0", "conv-1", 500_000, "plan"))
    build_store(data, idle_seconds=0)
    _assert_views_whole(data, monkeypatch, 1)


def test_a_later_turn_not_stored_yet_is_viewed_as_the_whole_store_reads_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    b = StoreBuilder(data)
    b.spans(agent_turn("a1", "conv-1", 1_000_000, "search") + agent_turn("x1", "conv-2", 2_000_000, "fetch"))
    build_store(data, idle_seconds=0)
    assert score_store(data).materialized is not None
    b.spans(agent_turn("a2", "conv-1", 3_000_000, "lookup") + agent_turn("a0", "conv-1", 500_000, "plan"))
    build_store(data, idle_seconds=0)  # conv-1's rows are stale: its traces are computed, x1 read from its rows
    wants = _assert_views_whole(data, monkeypatch, 1)
    # a1's failure (scored in round 1) is the second turn of conv-1 now: a0 came before it
    assert {tid: wants[tid]["root_cause"]["turn_index"] for tid in ("a1", "x1")} == {"a1": 2, "x1": 1}
