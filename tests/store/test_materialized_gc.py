"""Issue 31: the materialized query tables are collected with their builds, like step_scores."""

from __future__ import annotations

from tests.queries.test_materialized import assert_materialized_equal
from tests.score.score_support import StoreBuilder, agent_turn
from tracedag.pipeline.dag.build import build_store
from tracedag.pipeline.score.runner import score_store
from tracedag.pipeline.store import freshness, materialized
from tracedag.pipeline.store.views import connect


def _builds(data, table: str) -> set[str]:
    con = connect(data, shared_macros=False)  # no shared query macro called
    try:
        return {r[0] for r in con.execute(f"select distinct build_id from {table}").fetchall()}
    finally:
        con.close()


def test_a_full_rebuild_and_score_leave_only_the_new_builds_materialized_rows(tmp_path):
    data = tmp_path / "data"
    StoreBuilder(data).spans(agent_turn("a1", "conv-1", 1_000_000, "search") + agent_turn("b1", "conv-2", 2_000_000, "fetch"))
    first = build_store(data, idle_seconds=0)
    score_store(data)
    assert _builds(data, "materialized_failures") == {first.build_id}
    second = build_store(data, idle_seconds=0, full=True)  # collects what the first build's traces left
    con = connect(data, shared_macros=False)  # no shared query macro called
    try:
        assert not freshness.fresh(con, data)  # rebuilt, not scored yet: the SQL answers
    finally:
        con.close()
    score_store(data)
    third = build_store(data, idle_seconds=0, full=True)
    score_store(data)
    assert third.gc is not None
    for table in ("materialized_failures", "materialized_trace_summary", materialized.STATE):
        assert _builds(data, table) <= {second.build_id, third.build_id}, table
        assert first.build_id not in _builds(data, table)
    assert_materialized_equal(data)


def test_a_running_scorer_keeps_the_collector_off_the_materialized_tables(tmp_path):
    import fcntl

    data = tmp_path / "data"
    StoreBuilder(data).spans(agent_turn("a1", "conv-1", 1_000_000, "search"))
    build_store(data, idle_seconds=0)
    score_store(data)
    with open(data / "state" / "score.lock", "a+") as fh:  # a scorer is running
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        busy = build_store(data, idle_seconds=0, full=True)
    assert busy.gc is not None
    assert set(busy.gc.skipped) == {"step_scores", materialized.STATE,
                                    *(materialized.table_name(n) for n in materialized.SPECS)}
    con = connect(data, shared_macros=False)  # no shared query macro called
    try:
        assert con.execute("select count(*) from materialized_traces").fetchall()[0][0] == 1
    finally:
        con.close()
