"""A reader's freshness from what the rounds wrote since it last asked (``store.freshdelta``) is the SQL's.

``freshness._FRESHNESS_SQL`` reads every trace; a process that asked it before asks only about the traces of the
files new since and those stale then. Its answer (the built traces, the newest round's signature, the stale traces)
must be the SQL's over the whole store, listing after listing: builds, stored rounds, a later turn joining a stored
conversation, a trace rebuilt into another conversation, a late earlier turn; after a collection (files gone) it
says the SQL must answer, and goes on from the SQL's answer.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.score.score_support import StoreBuilder, agent_turn
from tracedag.pipeline.dag.build import build_store
from tracedag.pipeline.score import materialize as m
from tracedag.pipeline.store import current_rounds, freshdelta, freshness
from tracedag.pipeline.store.gc import GcSettings
from tracedag.pipeline.store.materialized import STATE
from tracedag.pipeline.store.swap import collect
from tracedag.pipeline.store.views import connect

NO_GC = GcSettings(enabled=False)


def _ask(data: Path, from_delta: bool = True) -> freshdelta.Raw:
    """The delta's answer for the store now, checked equal to the SQL's (None from the delta: the SQL's is kept as
    the next base, as ``freshness`` does); ``from_delta``: whether the delta must answer."""
    con = connect(data)
    try:
        files = freshness._listed(data)
        traces, states = freshness._of(data, files, "traces"), freshness._of(data, files, STATE)
        current = current_rounds.register(con, data)
        assert current is not None
        got = freshdelta.step(con, data, traces, states, current)
        n, _, sig, stale = con.execute(freshness._FRESHNESS_SQL).fetchall()[0]
        want = freshdelta.Raw(int(n), sig, tuple(stale))
        if got is None:
            assert not from_delta, "the delta did not answer"
            freshdelta.remember(data, traces, states, want)
        else:
            assert from_delta, "the delta answered a listing it must leave to the SQL"
            assert got == want
        return want
    finally:
        con.close()


def _built(b: StoreBuilder, data: Path, *turns: tuple[str, str, int, str]) -> None:
    b.spans([row for t in turns for row in agent_turn(*t)])
    build_store(data, idle_seconds=0, gc=NO_GC)


@pytest.fixture(autouse=True)
def _no_bases() -> None:
    freshdelta._BASES.clear()


def test_each_listing_is_answered_as_the_sql_answers_it_over_every_trace(tmp_path: Path) -> None:
    data = tmp_path / "data"
    b = StoreBuilder(data)
    _built(b, data, ("a1", "conv-1", 1_000_000, "search"), ("x1", "conv-2", 2_000_000, "fetch"))
    m.materialize(data, [])
    assert _ask(data, from_delta=False).stale == ()  # a process's first ask: the SQL
    _built(b, data, ("a2", "conv-1", 3_000_000, "lookup"), ("y1", "conv-3", 4_000_000, "plan"))
    assert _ask(data).stale == ("a1", "a2", "y1")  # conv-1 whole: its stored turn too
    _built(b, data, ("z1", "conv-4", 5_000_000, "search"))
    raw = _ask(data)
    assert raw.stale == ("a1", "a2", "y1", "z1") and raw.traces == 5
    m.materialize(data, [])  # a stored round: a new state file, every conversation answered again
    assert _ask(data).stale == ()
    _built(b, data, ("x1", "conv-1", 6_000_000, "fetch"))  # x1 built again, into conv-1
    assert _ask(data).stale == ("a1", "a2", "x1")
    assert _ask(data).stale == ("a1", "a2", "x1")  # the same listing: the same answer
    _built(b, data, ("a0", "conv-1", 500_000, "plan"))  # a late, earlier turn of conv-1
    raw = _ask(data)
    assert raw.stale == ("a0", "a1", "a2", "x1") and raw.traces == 6
    m.materialize(data, [])
    assert _ask(data).stale == ()


def test_a_collection_is_left_to_the_sql_and_the_next_round_to_the_delta(tmp_path: Path) -> None:
    data = tmp_path / "data"
    b = StoreBuilder(data)
    _built(b, data, ("a1", "conv-1", 1_000_000, "search"), ("c1", "conv-3", 1_500_000, "fetch"))
    m.materialize(data, [])
    _ask(data, from_delta=False)
    _built(b, data, ("a1", "conv-1", 2_000_000, "search"), ("b1", "conv-2", 3_000_000, "plan"))  # a1 rebuilt
    assert _ask(data).stale == ("a1", "b1")
    collect(data, compact=True)  # a1's first build dropped, the files merged: files gone from the listing
    assert _ask(data, from_delta=False).stale == ("a1", "b1")
    _built(b, data, ("b2", "conv-2", 4_000_000, "fetch"))
    assert _ask(data).stale == ("a1", "b1", "b2")


def test_a_reader_asks_the_delta_from_its_second_listing_on(tmp_path: Path) -> None:
    """``freshness.freshness`` (what every reader asks) takes the delta's answer once this process asked the SQL."""
    data = tmp_path / "data"
    b = StoreBuilder(data)
    _built(b, data, ("a1", "conv-1", 1_000_000, "search"), ("c1", "conv-3", 1_500_000, "fetch"),
           ("d1", "conv-4", 1_700_000, "plan"))
    m.materialize(data, [])
    con = connect(data)
    try:
        assert freshness.freshness(con, data).fresh
        assert str(data.resolve()) in freshdelta._BASES
        _built(b, data, ("a2", "conv-1", 2_000_000, "lookup"))
        answer = freshness.freshness(con, data)
        assert answer.usable and answer.stale == ("a1", "a2") and answer.traces == 4
        assert freshdelta._BASES[str(data.resolve())].raw.stale == ("a1", "a2")  # the delta's, kept as the next base
    finally:
        con.close()
