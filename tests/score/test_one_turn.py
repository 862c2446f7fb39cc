"""A round's fixed cost (issues #31, #33): the stored ``root_causes`` per conversation of one-turn conversations are
their rows per trace (``materialize.ALONE``), a small store's first round runs over a copy of its rows
(``COPY_TRACES``), and a connection whose views include the stored rows' state scans no catalog for it."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from tests.score.score_support import StoreBuilder, agent_turn
from tests.score.test_materialize_parts import _answers_equal_the_sql
from tracedag.pipeline.dag.build import build_store
from tracedag.pipeline.score import materialize as m
from tracedag.pipeline.score.live_store import LiveStore
from tracedag.pipeline.score.runner import LiveRound, score_store
from tracedag.pipeline.store import freshness
from tracedag.pipeline.store.views import connect


def _counted(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str | None]]:
    """The (query, per) of every stored query ``materialize`` computes from its SQL from now on."""
    asked: list[tuple[str, str | None]] = []
    real = m.result_rows

    def counting(con: object, name: str, per: str | None, round_ns: int) -> pa.Table:
        asked.append((name, per))
        return real(con, name, per, round_ns)  # type: ignore[arg-type]

    monkeypatch.setattr(m, "result_rows", counting)
    return asked


def test_one_turn_conversations_take_their_root_causes_per_conversation_from_those_per_trace(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    b = StoreBuilder(data)
    b.spans(agent_turn("a1", "conv-a", 1_000_000, "search") + agent_turn("z1", "conv-z", 1_500_000, "fetch"))
    build_store(data, idle_seconds=0)
    asked = _counted(monkeypatch)
    assert score_store(data).materialized.rows["root_causes per=conversation"] == 2
    assert ("root_causes", "trace") in asked and ("root_causes", "conversation") not in asked
    _answers_equal_the_sql(data)
    # a later turn of conv-a: its conversation has two traces, its rows across turns are computed
    b.spans(agent_turn("a2", "conv-a", 3_000_000, "lookup"))
    build_store(data, idle_seconds=0)
    asked.clear()
    assert score_store(data).materialized.traces == 2
    assert ("root_causes", "conversation") in asked
    _answers_equal_the_sql(data)


def test_a_store_larger_than_a_copy_computes_them_over_its_views(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    StoreBuilder(data).spans(agent_turn("a1", "conv-a", 1_000_000, "search")
                             + agent_turn("z1", "conv-z", 1_500_000, "fetch"))
    build_store(data, idle_seconds=0)
    monkeypatch.setattr(m, "COPY_TRACES", 1)  # the first round runs over the views of the store's files
    copies: list[object] = []
    real = m._snapshot
    monkeypatch.setattr(m, "_snapshot", lambda *a, **k: copies.append(a) or real(*a, **k))
    asked = _counted(monkeypatch)
    assert score_store(data).materialized.full
    assert not copies and ("root_causes", "conversation") in asked
    _answers_equal_the_sql(data)


def test_a_small_stores_first_round_runs_over_a_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    StoreBuilder(data).spans(agent_turn("a1", "conv-a", 1_000_000, "search")
                             + agent_turn("a2", "conv-a", 2_000_000, "fetch"))
    build_store(data, idle_seconds=0)
    copies: list[object] = []
    real = m._snapshot
    monkeypatch.setattr(m, "_snapshot", lambda *a, **k: copies.append(a) or real(*a, **k))
    stats = score_store(data).materialized
    assert stats.full and stats.traces == 2 and copies
    _answers_equal_the_sql(data)


def test_the_live_stores_pass_takes_them_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    b = StoreBuilder(data)
    b.spans(agent_turn("a1", "conv-a", 1_000_000, "search"))
    build_store(data, idle_seconds=0)
    score_store(data)
    b.spans(agent_turn("b1", "conv-b", 2_000_000, "plan") + agent_turn("c1", "conv-c", 2_100_000, "pay"))
    build_store(data, idle_seconds=0)
    score_store(data, live=LiveRound(materialize=False))
    asked = _counted(monkeypatch)
    store = LiveStore(data, 100)
    try:
        copied = store.copy()
        store.copy_spans(copied)
        results = store.compute(copied)
        store.write(copied, results)
    finally:
        store.close()
    assert copied.traces == 2 and ("root_causes", "conversation") not in asked
    _answers_equal_the_sql(data)


def test_a_connection_made_with_the_state_view_knows_it(tmp_path: Path) -> None:
    data = tmp_path / "data"
    StoreBuilder(data).spans(agent_turn("a1", "conv-a", 1_000_000, "search"))
    build_store(data, idle_seconds=0)
    before = connect(data)
    try:
        assert before not in freshness._HAS_VIEW and not freshness.has_state_view(before)
        score_store(data)
        after = connect(data)
        try:
            assert freshness._HAS_VIEW.get(after) and freshness.has_state_view(after)
        finally:
            after.close()
    finally:
        before.close()
