"""Issue 31: ``store.mixed`` computes a query whose rows are all about failed steps (``mixed.FAILURE_ROWS``:
failures, propagation, root_causes) over the conversations not stored yet that have a failing score row only. A
live poll's backlog is mostly traces that passed or are not scored yet (a round between its build and its score):
their rows are none, so they are left out of the views (a later failing turn of a stored conversation, read with
its earlier turns: test_materialized); the answers stay the SQL's over every trace, and a query
with rows for every trace (trace_summary) on the same connection gets the views of every trace not stored."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.queries.test_materialized import CASES, _exact, four_stored_conversations, references
from tests.score.score_support import agent_turn
from tracedag import queries
from tracedag.pipeline.dag.build import build_store
from tracedag.pipeline.score.runner import LiveRound, score_store
from tracedag.pipeline.store import freshness, mixed
from tracedag.pipeline.store.querying import bind_params, run_named
from tracedag.pipeline.store.views import connect


def _passing_turn(trace: str, conversation: str, start: int) -> list[dict[str, Any]]:
    """``agent_turn`` whose tool does not fail: no step of it is scored as a failure."""
    root, tool, llm = agent_turn(trace, conversation, start, "lookup")
    tool = {k: v for k, v in tool.items() if k not in ("error_type", "status_message")} | {"status_code": 1}
    return [root, tool, llm]


def _held(con: Any, data: Path, name: str, given: dict[str, str]) -> tuple[str, ...]:
    values = bind_params(queries.describe(name), given)
    assert mixed.read(con, data, name, queries.load(name), values) is not None
    return mixed._SCOPED[con].traces


def _assert_mixed_equal(data: Path, stale: tuple[str, ...]) -> None:
    """Each stored query, whole store and windowed, read by ``store.mixed`` and by ``run_named``: the rows of its
    SQL over every trace."""
    cases = [*CASES, ("failures", {"since_ns": "9600000"}), ("root_causes", {"trace_id": "u1"}),
             ("root_causes", {"trace_id": "p1"})]
    for (name, given), want in zip(cases, references(data, cases), strict=True):
        con = connect(data)  # mixed.read restricts its connection's views
        try:
            assert freshness.freshness(con, data).stale == stale
            got = mixed.read(con, data, name, queries.load(name), bind_params(queries.describe(name), given))
            assert got is not None and _exact(got.to_pylist()) == want, f"{name} {given}"
        finally:
            con.close()
        assert _exact(run_named(data, name, given).to_pylist()) == want, f"{name} {given}"


def test_conversations_without_a_failing_score_are_left_out_of_the_failure_queries_views(
        tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    data = tmp_path / "data"
    b = four_stored_conversations(tmp_path_factory, data)
    # built and scored, not stored: a conversation that passed; then built only: a failing one not scored yet
    b.spans(_passing_turn("p1", "conv-p1", 9_500_000))
    built = build_store(data, idle_seconds=0)
    score_store(data, live=LiveRound(built.build_id, built.received_from, materialize=False))
    b.spans(agent_turn("u1", "conv-u1", 9_800_000, "plan"))
    build_store(data, idle_seconds=0)
    stale = ("p1", "u1")
    _assert_mixed_equal(data, stale)  # every stored query, whole store and windowed: the SQL's rows
    con = connect(data)
    try:
        assert freshness.freshness(con, data).stale == stale
        assert _held(con, data, "root_causes", {}) == ()  # p1 passed, u1 is not scored: no view holds a trace
        assert not mixed.covers(con, "u1")
        assert _held(con, data, "failures", {}) == ()  # the same threshold: the views kept
        assert _held(con, data, "trace_summary", {}) == stale  # a row for every trace: all of them again
        assert _held(con, data, "root_causes", {}) == stale  # views of every trace serve a failure query too
    finally:
        con.close()
    # u1 scored: its conversation has a failing score row now, it is read
    score_store(data, live=LiveRound(None, None, materialize=False))
    con = connect(data)
    try:
        assert _held(con, data, "propagation", {}) == ("u1",) and mixed.covers(con, "u1")
    finally:
        con.close()
    _assert_mixed_equal(data, stale)
