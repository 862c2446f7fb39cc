"""A live store pass finds the traces waiting, and their conversations, from what changed since the last pass.

``score.live_waiting.Waiting`` answers ``materialize._PENDING_SQL`` (the traces whose latest build has no stored
round) and ``materialize._TRACES_SQL`` (every trace of their conversations) from the ``traces`` files new since the
last pass and the traces that waited then, not from every row of the store. Its answers must be the SQL's, pass after
pass: after builds, stored rounds, a later turn joining a conversation, a trace rebuilt into another conversation, a
late turn of a stored conversation, and a collection that merges the files.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from tests.score.score_support import StoreBuilder, agent_turn
from tracedag.pipeline.dag.build import build_store
from tracedag.pipeline.score import materialize as m
from tracedag.pipeline.score.live_waiting import Waiting
from tracedag.pipeline.store.fetch import arrow
from tracedag.pipeline.store.gc import GcSettings
from tracedag.pipeline.store.materialized import signature
from tracedag.pipeline.store.swap import collect
from tracedag.pipeline.store.views import connect

NO_GC = GcSettings(enabled=False)


def _sorted(t: pa.Table) -> list[dict[str, object]]:
    return t.take(pc.sort_indices(t, sort_keys=[(c, "ascending") for c in t.column_names])).to_pylist()


def _pass(data: Path, waiting: Waiting) -> tuple[set[str], list[dict[str, object]]]:
    """One pass's answers by ``waiting``, checked equal to the SQL's over the whole store; returns them."""
    con = connect(data)
    try:
        sig = signature(data)
        found = waiting.traces(con)
        expected = arrow(con, m._PENDING_SQL)
        assert sorted(found.column("trace_id").to_pylist()) == sorted(expected.column("trace_id").to_pylist())
        con.register(m.SCOPE, found)
        state = _sorted(waiting.state(con, sig))
        assert state == _sorted(arrow(con, m._TRACES_SQL, [0, sig]))
        return set(found.column("trace_id").to_pylist()), state
    finally:
        con.close()


def _built(b: StoreBuilder, data: Path, *turns: tuple[str, str, int, str]) -> None:
    b.spans([row for t in turns for row in agent_turn(*t)])
    build_store(data, idle_seconds=0, gc=NO_GC)


def test_each_pass_finds_what_the_sql_finds_over_the_whole_store(tmp_path: Path) -> None:
    data = tmp_path / "data"
    b = StoreBuilder(data)
    waiting = Waiting(data)
    _built(b, data, ("a1", "conv-1", 1_000_000, "search"), ("x1", "conv-2", 2_000_000, "fetch"))
    m.materialize(data, [])  # a first round stored: the state view exists from now on
    assert _pass(data, waiting) == (set(), [])  # the first pass: the whole store's SQL
    _built(b, data, ("a2", "conv-1", 3_000_000, "lookup"), ("y1", "conv-3", 4_000_000, "plan"))
    found, state = _pass(data, waiting)
    assert found == {"a2", "y1"}
    assert {r["trace_id"] for r in state} == {"a1", "a2", "y1"}  # conv-1 whole: its stored turn too
    _built(b, data, ("z1", "conv-4", 5_000_000, "search"))
    assert _pass(data, waiting)[0] == {"a2", "y1", "z1"}  # those that waited wait still, beside the new
    m.materialize(data, [])
    assert _pass(data, waiting) == (set(), [])
    _built(b, data, ("x1", "conv-1", 6_000_000, "fetch"))  # x1 built again, into conv-1
    found, state = _pass(data, waiting)
    assert found == {"x1"} and {r["trace_id"] for r in state} == {"a1", "a2", "x1"}
    collect(data, compact=True)  # merged files: new to the listing, their traces asked again
    assert _pass(data, waiting)[0] == {"x1"}
    _built(b, data, ("a0", "conv-1", 500_000, "plan"))  # a late, earlier turn of conv-1
    found, state = _pass(data, waiting)
    assert found == {"x1", "a0"} and {r["trace_id"] for r in state} == {"a0", "a1", "a2", "x1"}
    m.materialize(data, [])
    assert _pass(data, waiting) == (set(), [])


def test_an_empty_pass_after_a_collection_reads_no_trace(tmp_path: Path) -> None:
    data = tmp_path / "data"
    b = StoreBuilder(data)
    waiting = Waiting(data)
    _built(b, data, ("a1", "conv-1", 1_000_000, "search"))
    m.materialize(data, [])
    _pass(data, waiting)
    collect(data, compact=True)
    assert _pass(data, waiting) == (set(), [])
