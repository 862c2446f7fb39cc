"""Materializing a backlog in parts (issue #31): a live collector stores the named queries' results of many
rounds at once, at most ``chunk`` traces (whole conversations) over one copy of their rows at a time; every
part's rows equal what the queries' SQL computes over the whole store."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.score.score_support import StoreBuilder, agent_turn
from tracedag import queries
from tracedag.pipeline.dag.build import build_store
from tracedag.pipeline.score import materialize as m
from tracedag.pipeline.score.live_store import LiveStore
from tracedag.pipeline.score.materialize import materialize
from tracedag.pipeline.score.runner import LiveRound, score_store
from tracedag.pipeline.store.fetch import arrow
from tracedag.pipeline.store.querying import bind_params, run_named, run_sql
from tracedag.pipeline.store.views import connect

NAMED = [("failures", {}), ("propagation", {}), ("root_causes", {}), ("root_causes", {"per": "conversation"}),
         ("workflow_scores", {}), ("trace_summary", {})]


def _rounded(rows: list[dict]) -> list[dict]:
    return [{k: float(f"{v:.12g}") if isinstance(v, float) else v for k, v in r.items()} for r in rows]


def _answers_equal_the_sql(data: Path) -> None:
    """Each named query's answer equals its SQL's rows, all run on one plain connection (a connection each cost more
    CPU than the queries on these small stores)."""
    con = connect(data)
    try:
        sql = [_rounded(arrow(con, queries.load(name), bind_params(queries.describe(name), given)).to_pylist())
               for name, given in NAMED]
    finally:
        con.close()
    for (name, given), want in zip(NAMED, sql, strict=True):
        assert _rounded(run_named(data, name, given).to_pylist()) == want, f"{name} {given}"


def test_a_backlog_is_materialized_in_parts_of_whole_conversations(tmp_path: Path) -> None:
    data = tmp_path / "data"
    b = StoreBuilder(data)
    b.spans(agent_turn("a1", "conv-a", 1_000_000, "search") + agent_turn("z1", "conv-z", 1_500_000, "fetch"))
    build_store(data, idle_seconds=0)
    assert score_store(data).materialized.full  # the first round: every trace, over a copy of their rows
    # rounds a live collector scored without storing results: a later turn of conv-a, two new conversations
    b.spans(agent_turn("a2", "conv-a", 3_000_000, "lookup") + agent_turn("b1", "conv-b", 3_100_000, "plan")
            + agent_turn("b2", "conv-b", 3_200_000, "plan") + agent_turn("c1", "conv-c", 3_300_000, "pay"))
    build_store(data, idle_seconds=0)
    scored = score_store(data, live=LiveRound(materialize=False))
    assert scored.materialized is None
    _answers_equal_the_sql(data)  # nothing stored for the new turns: the SQL answers
    stats = materialize(data, scored.files, chunk=2)
    assert stats.traces == 5 and not stats.full  # conv-a whole (a1, a2), conv-b, conv-c; not conv-z
    state = run_sql(data, "select trace_id, conversation_key, mat_round from materialized_traces "
                          "where trace_id <> 'z1' order by mat_round desc").to_pylist()
    parts: dict[int, set[str]] = {}
    for r in state[:5]:
        parts.setdefault(r["mat_round"], set()).add(r["conversation_key"])
    assert sorted(map(sorted, parts.values())) == [["conv-a"], ["conv-b"], ["conv-c"]]  # 2 traces a part at most
    _answers_equal_the_sql(data)
    turns = {r["trace_id"]: r["turn_index"] for r in run_named(data, "root_causes").to_pylist()}
    assert turns == {"a1": 1, "a2": 2, "b1": 1, "b2": 2, "c1": 1, "z1": 1}
    assert materialize(data, []).traces == 0  # nothing left


def test_a_live_stores_first_round_is_cut_into_parts_too(tmp_path: Path) -> None:
    """A live collector's first stored round (nothing stored yet: every trace pending) stores a part of ``limit``
    traces, not the whole store: at 40k spans/s its first round, a minute in, held the loop for over a minute
    (p99 159 s against 67 s before anything was stored). The next parts store the rest; answers equal the SQL."""
    data = tmp_path / "data"
    b = StoreBuilder(data)
    b.spans(agent_turn("a1", "conv-a", 1_000_000, "search") + agent_turn("a2", "conv-a", 2_000_000, "lookup")
            + agent_turn("b1", "conv-b", 3_000_000, "plan") + agent_turn("c1", "conv-c", 4_000_000, "pay"))
    build_store(data, idle_seconds=0)
    assert score_store(data, live=LiveRound(materialize=False)).materialized is None
    first = materialize(data, [], limit=2)
    assert first.traces == 2 and not first.full  # conv-a whole, alone
    stored = set(run_sql(data, "select trace_id from materialized_traces").column("trace_id").to_pylist())
    assert stored == {"a1", "a2"}
    _answers_equal_the_sql(data)  # stored rows for conv-a, the SQL for the rest
    assert materialize(data, [], limit=2).traces == 2  # conv-b and conv-c
    _answers_equal_the_sql(data)
    assert materialize(data, [], limit=2).traces == 0  # nothing left
    assert materialize(data, []).traces == 0  # tracedag score: nothing to do either


def test_a_parts_spans_copy_leaves_out_the_columns_no_stored_query_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``materialize.UNREAD``: the live store's copy of a part's spans has no ``attributes`` (no stored query or
    shared macro names it) and the stored answers are the SQL's; a column a stored query names is copied."""
    data = tmp_path / "data"
    b = StoreBuilder(data)
    b.spans(agent_turn("a1", "conv-a", 1_000_000, "search"))
    build_store(data, idle_seconds=0)
    score_store(data)
    b.spans(agent_turn("a2", "conv-a", 3_000_000, "lookup") + agent_turn("b1", "conv-b", 3_100_000, "plan"))
    build_store(data, idle_seconds=0)
    score_store(data, live=LiveRound(materialize=False))
    store = LiveStore(data, 100)
    try:
        copied = store.copy()
        assert copied.traces == 3  # conv-a whole, conv-b
        store.copy_spans(copied)
        con = store._connection()
        columns = {r[0] for r in con.execute(f"describe {m.SNAPSHOT}spans").fetchall()}
        assert "attributes" not in columns and {"output_text", "input_text", "status_message"} <= columns
        store.write(copied, store.compute(copied))
    finally:
        store.close()
    _answers_equal_the_sql(data)
    monkeypatch.setitem(m.UNREAD, "spans", ("attributes", "output_text"))  # root_causes reads output_text
    assert m._unread("spans") == ("attributes",)
