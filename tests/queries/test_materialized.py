"""Materialized named queries (issue 31): the rows stored at score time equal the SQL's.

The SQL definitions are the reference: on a copy of every fixture store (the query and RCA
fixtures, the demo's store) and after incremental build+score rounds, each materialized query read
through ``tracedag query`` (``run_named``) and through its table macro gives exactly the rows, in
order, that its SQL gives over the same store with the same parameters.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.demo.demo_support import DemoRun, private_demo
from tests.score.score_support import StoreBuilder, agent_turn
from tracedag import queries
from tracedag.pipeline.dag.build import build_store
from tracedag.pipeline.score.materialize import materialize
from tracedag.pipeline.score.runner import score_store
from tracedag.pipeline.store import materialized, mixed
from tracedag.pipeline.store.querying import bind_params, run_named, run_sql, to_arrow
from tracedag.pipeline.store.views import connect, create_query_macros

CASES = [("failures", {}), ("propagation", {}), ("root_causes", {}), ("root_causes", {"per": "conversation"}),
         ("workflow_scores", {}), ("trace_summary", {})]


def _exact(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    """Rows with doubles rounded to 12 significant digits: DuckDB sums in parallel, so a weighted mean
    (workflow_score) may differ in its last bits between two runs of the very same SQL."""
    return [{k: float(f"{v:.12g}") if isinstance(v, float) else v for k, v in r.items()} for r in rows]


def _reference(data: Path, name: str, given: dict[str, str]) -> list[dict[str, object]]:
    """The rows of the query's SQL text itself, run on a plain connection (never the stored rows)."""
    con = connect(data)
    try:
        values = bind_params(queries.describe(name), given)
        return _exact(to_arrow(con.sql(queries.load(name), params=values)).to_pylist())
    finally:
        con.close()


def _macro(data: Path, name: str, given: dict[str, str]) -> list[dict[str, object]]:
    args = ", ".join(f"{k} := '{v}'" for k, v in given.items())
    sql = f"select * from {name}({args})"
    con = connect(data)
    try:
        create_query_macros(con, sql)
        return _exact(to_arrow(con.sql(sql)).to_pylist())
    finally:
        con.close()


def _reads_stored(data: Path, name: str, given: dict[str, str]) -> bool:
    con = connect(data)
    try:
        values = bind_params(queries.describe(name), given)
        return materialized.named_statement(con, data, name, values) is not None
    finally:
        con.close()


def assert_materialized_equal(data: Path, expect_rows: bool = True) -> int:
    """Every case: ``run_named`` and the macro read stored rows, and they equal the SQL's; return the rows."""
    total = 0
    for name, given in CASES:
        assert _reads_stored(data, name, given), f"{name} {given} does not read its materialized rows"
        want = _reference(data, name, given)
        assert _exact(run_named(data, name, given).to_pylist()) == want, f"{name} {given}"
        assert _macro(data, name, given) == want, f"{name}() {given}"
        total += len(want)
    if expect_rows:
        assert total > 0
    return total


def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "store"
    shutil.copytree(src, dst)
    return dst


def four_stored_conversations(data: Path) -> StoreBuilder:
    """A store of four one-turn conversations (a1, x1, y1, z1), built and scored (their rows stored); its builder,
    to send later turns."""
    b = StoreBuilder(data)
    b.spans([s for i, c in enumerate(("a1", "x1", "y1", "z1"))
             for s in agent_turn(c, f"conv-{c}", 1_000_000 * (i + 1), "search")])
    build_store(data, idle_seconds=0)
    score_store(data)
    return b


@pytest.mark.parametrize("fixture", ["query_store", "rca_store"])
def test_fixture_stores_materialized_rows_equal_the_sql(fixture: str, request: pytest.FixtureRequest,
                                                        tmp_path: Path) -> None:
    data = _copy(request.getfixturevalue(fixture), tmp_path)
    assert not _reads_stored(data, "failures", {})  # nothing materialized yet: the SQL answers
    stats = materialize(data, [])
    assert stats.full and stats.traces > 0
    assert_materialized_equal(data)


def test_demo_store_is_materialized_by_its_scoring_and_equals_the_sql(demo_newcomer: DemoRun, tmp_path: Path) -> None:
    data = private_demo(demo_newcomer, tmp_path / "newcomer").data  # tracedag demo, run once per test run
    assert materialized.has_rounds(data)
    assert_materialized_equal(data)


def test_other_parameters_compute_from_the_sql(query_store: Path, tmp_path: Path) -> None:
    data = _copy(query_store, tmp_path)
    materialize(data, [])
    for name, given in [("failures", {"fail_threshold": "1.5"}), ("root_causes", {"strategy": "weighted"}),
                        ("root_causes", {"per": "step"}), ("propagation", {"per": "conversation"}),
                        ("trace_summary", {"pass_threshold": "4.5"})]:
        assert not _reads_stored(data, name, given)
        want = _reference(data, name, given)
        assert _exact(run_named(data, name, given).to_pylist()) == want
        assert _macro(data, name, given) == want


def test_one_trace_and_a_time_window_read_the_stored_rows(query_store: Path, tmp_path: Path) -> None:
    data = _copy(query_store, tmp_path)
    materialize(data, [])
    for name in ("failures", "root_causes", "trace_summary"):
        for given in ({"trace_id": "t2-converge"}, {"since_ns": "1000"}, {"trace_id": "no-such-trace"}):
            assert _reads_stored(data, name, given)
            want = _reference(data, name, given)
            assert _exact(run_named(data, name, given).to_pylist()) == want
            assert _macro(data, name, given) == want


def test_changed_human_labels_make_the_store_stale_until_the_next_round(query_store: Path, tmp_path: Path) -> None:
    data = _copy(query_store, tmp_path)
    materialize(data, [])
    human = data / "tables" / "step_scores" / "human.parquet"
    shutil.copy(next((data / "tables" / "step_scores").glob("*.parquet")), human)
    assert not _reads_stored(data, "failures", {})
    assert materialize(data, []).full
    assert_materialized_equal(data)


def test_incremental_rounds_recompute_the_conversation_a_later_turn_joins(tmp_path: Path) -> None:
    data = tmp_path / "data"
    b = StoreBuilder(data)
    b.spans(agent_turn("a1", "conv-1", 1_000_000, "search") + agent_turn("x1", "conv-2", 2_000_000, "fetch"))
    build_store(data, idle_seconds=0)
    first = score_store(data)
    assert first.materialized is not None and first.materialized.full
    assert_materialized_equal(data)
    # round 2: a later turn of conv-1 (and an earlier one, arriving late) change conv-1's rows
    b.spans(agent_turn("a2", "conv-1", 3_000_000, "lookup") + agent_turn("a0", "conv-1", 500_000, "plan"))
    build_store(data, idle_seconds=0)
    assert not _reads_stored(data, "root_causes", {})  # built, not scored: the SQL answers
    second = score_store(data)
    assert second.materialized is not None and not second.materialized.full
    assert second.materialized.traces == 3  # conv-1 whole (a0, a1, a2), not conv-2
    assert_materialized_equal(data)
    turns = {r["trace_id"]: r["turn_index"] for r in run_named(data, "root_causes", {}).to_pylist()}
    assert turns == {"a0": 1, "a1": 2, "a2": 3, "x1": 1}
    conv = run_named(data, "root_causes", {"per": "conversation"}).to_pylist()
    assert sorted(r["trace_id"] for r in conv) == ["a2", "x1"]


def test_rows_materialized_by_other_sql_are_not_read_and_the_next_round_redoes_every_trace(query_store: Path,
                                                                                             tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = _copy(query_store, tmp_path)
    materialize(data, [])
    for f in (data / "tables" / materialized.STATE).glob("*.parquet"):  # as an older tracedag's SQL wrote them
        t = pq.read_table(f)
        old = pa.array([s.replace(materialized.definitions_hash(), "0" * 16) for s in t.column("signature").to_pylist()])
        pq.write_table(t.set_column(t.schema.get_field_index("signature"), "signature", old), f)
    assert not _reads_stored(data, "trace_summary", {})
    want = _reference(data, "trace_summary", {})
    assert _exact(run_named(data, "trace_summary", {}).to_pylist()) == want
    assert materialize(data, []).full
    assert_materialized_equal(data)


def _assert_mixed_equal(data: Path, stale: set[str]) -> None:
    """Whole-store and windowed reads: the stored rows of the answered traces plus the SQL over ``stale``
    (``store.mixed``) equal the SQL over every trace; one trace is read from its stored rows when answered."""
    con = connect(data)
    try:
        state = materialized.freshness(con, data)
        assert state.usable and set(state.stale) == stale
        for name, given in CASES:
            values = bind_params(queries.describe(name), given)
            got = mixed.read(con, data, name, queries.load(name), values)
            assert got is not None and _exact(got.to_pylist()) == _reference(data, name, given), f"{name} {given}"
            con.close()
            con = connect(data)
        one = {t: materialized.named_statement(con, data, "trace_summary", bind_params(
            queries.describe("trace_summary"), {"trace_id": t})) is not None for t in ("x1", "a1")}
        assert one == {"x1": True, "a1": False}
    finally:
        con.close()
    for name, given in [*CASES, ("failures", {"since_ns": "2500000"}), ("trace_summary", {"trace_id": "a1"}),
                        ("root_causes", {"trace_id": "x1"})]:
        assert _exact(run_named(data, name, given).to_pylist()) == _reference(data, name, given), f"{name} {given}"


def test_a_store_whose_newest_builds_are_not_materialized_reads_stored_rows_and_computes_the_rest(
        tmp_path: Path) -> None:
    data = tmp_path / "data"
    b = StoreBuilder(data)
    b.spans([s for i, c in enumerate(("a1", "x1", "y1", "z1"))
             for s in agent_turn(c, f"conv-{c}", 1_000_000 * (i + 1), "search")])
    build_store(data, idle_seconds=0)
    assert score_store(data).materialized is not None
    # a later and an earlier turn of a1's conversation, built but not scored: its three turns are computed
    b.spans(agent_turn("a2", "conv-a1", 9_000_000, "lookup") + agent_turn("a0", "conv-a1", 500_000, "plan"))
    build_store(data, idle_seconds=0)
    _assert_mixed_equal(data, {"a0", "a1", "a2"})
    # every trace rebuilt (the previous builds collected): nothing is answered, the SQL runs alone
    build_store(data, idle_seconds=0, full=True)
    con = connect(data)
    try:
        assert not materialized.freshness(con, data).usable
    finally:
        con.close()
    assert _exact(run_named(data, "root_causes", {}).to_pylist()) == _reference(data, "root_causes", {})
    score_store(data)
    assert_materialized_equal(data)


def _freshness(data: Path) -> materialized.Freshness:
    materialized._FRESH.clear()  # as a new process: only what is kept on disk is remembered
    con = connect(data)
    try:
        return materialized.freshness(con, data)
    finally:
        con.close()


def test_a_freshness_answer_is_kept_for_the_next_process_and_asked_again_after_a_build_or_collection(
        tmp_path: Path) -> None:
    import json

    data = tmp_path / "data"
    b = StoreBuilder(data)
    b.spans([s for i, c in enumerate(("a1", "x1", "y1")) for s in agent_turn(c, f"conv-{c}", 1_000_000 * (i + 1), "search")])
    build_store(data, idle_seconds=0)
    score_store(data)
    assert _freshness(data).fresh
    kept = list((data / "state" / materialized.KEPT).glob("fresh-*.json"))
    assert len(kept) == 1
    # the next process reads the kept answer instead of the tables: an answer written there is the one given
    kept[0].write_text(json.dumps({"usable": False, "stale": [], "traces": 3}))
    assert not _freshness(data).usable
    b.spans(agent_turn("a2", "conv-a1", 9_000_000, "lookup"))
    build_store(data, idle_seconds=0)  # a new build: a new listing, asked again
    assert set(_freshness(data).stale) == {"a1", "a2"}
    assert len(list((data / "state" / materialized.KEPT).glob("fresh-*.json"))) == 1
    build_store(data, idle_seconds=0, full=True)  # every trace rebuilt, the earlier builds collected
    assert not _freshness(data).usable
    score_store(data)
    assert _freshness(data).fresh
    assert_materialized_equal(data)


def _state_files(data: Path) -> list[Path]:
    return sorted((data / "tables" / materialized.STATE).glob("part-*.parquet"))


@pytest.mark.parametrize("fixture", ["query_store", "rca_store"])
def test_a_store_with_more_traces_than_a_part_is_stored_in_parts_that_equal_the_sql(
        fixture: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """``tracedag score``'s first round of a store with more traces than a part stores them a part at a time (at
    10M spans one round of every trace took more than 19 GB and was killed): whole conversations in each part,
    each part's state with it, and the rows equal the SQL's."""
    data = _copy(request.getfixturevalue(fixture), tmp_path)
    stats = materialize(data, [], part=2)
    traces = run_sql(data, "select count(*) as n, count(distinct coalesce(conversation_id, trace_id)) as c "
                           "from traces").to_pylist()[0]
    assert stats.full and stats.traces == traces["n"] > 2
    parts = run_sql(data, "select mat_round, count(*) as n, count(distinct conversation_key) as c "
                          "from materialized_traces group by mat_round").to_pylist()
    assert len(parts) == len(_state_files(data)) > 1  # one state file a part
    assert all(p["n"] <= 2 or p["c"] == 1 for p in parts)  # at most 2 traces, or one conversation with more
    assert sum(p["c"] for p in parts) == traces["c"]  # no conversation split between parts
    assert_materialized_equal(data)


def test_changed_labels_are_stored_again_in_parts_and_their_state_lands_at_once(query_store: Path,
                                                                                tmp_path: Path) -> None:
    """After the human labels change every trace is stored again; a store with more traces than a part is done in
    parts, and the state of every part is written after the last one, in one file: until then readers see the old
    signature and take the SQL, and an interrupted round leaves nothing that looks current."""
    data = _copy(query_store, tmp_path)
    materialize(data, [])
    before = _state_files(data)
    human = data / "tables" / "step_scores" / "human.parquet"
    shutil.copy(next((data / "tables" / "step_scores").glob("*.parquet")), human)
    assert not _reads_stored(data, "failures", {})
    stats = materialize(data, [], part=2)
    assert stats.full
    new = [f for f in _state_files(data) if f not in before]
    assert len(new) == 1
    assert len(set(pq.read_table(new[0]).column("mat_round").to_pylist())) > 1  # several parts, one state file
    assert_materialized_equal(data)


def test_a_round_keeps_each_traces_newest_round_for_the_readers(query_store: Path, tmp_path: Path) -> None:
    """Each part's state advances the table of each trace's newest stored round kept for the state files'
    listing (``store.current_rounds``): the first reader after a round finds it instead of computing it."""
    data = _copy(query_store, tmp_path)
    materialize(data, [], part=2)
    kept = list((data / "state" / "materialized").glob("current-*.parquet"))
    assert len(kept) == 1  # no reader ran yet: the round kept it
    want = run_sql(data, "select trace_id, arg_max(mat_round, mat_round) as mat_round from materialized_traces "
                         "group by trace_id order by trace_id").to_pylist()
    got = pq.read_table(kept[0], columns=["trace_id", "mat_round"]).sort_by("trace_id").to_pylist()
    assert got == want
    assert_materialized_equal(data)


def test_a_poll_of_a_store_with_traces_waiting_makes_no_connection_for_the_stored_rows_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once this process knows the stored rows do not answer every trace (``known_freshness``), a whole-store read
    connects once (the stored rows plus the SQL), not first for the stored rows alone; one trace they answer is still
    read from them alone; the answers are the SQL's."""
    from tracedag.pipeline.store import querying

    data = tmp_path / "data"
    b = four_stored_conversations(data)
    b.spans(agent_turn("a2", "conv-a1", 9_000_000, "lookup"))
    build_store(data, idle_seconds=0)  # built, not stored: conv-a1 is computed
    assert materialized.known_freshness(data) is None or not materialized.known_freshness(data).fresh
    run_named(data, "root_causes")  # the freshness answer is now kept
    known = materialized.known_freshness(data)
    assert known is not None and set(known.stale) == {"a1", "a2"}
    calls: list[object] = []
    real = querying.connect
    monkeypatch.setattr(querying, "connect", lambda *a, **k: calls.append(k.get("tables")) or real(*a, **k))
    assert _exact(run_named(data, "root_causes").to_pylist()) == _reference(data, "root_causes", {})
    assert calls == [None]
    calls.clear()
    got = run_named(data, "trace_summary", {"trace_id": "x1"})
    assert _exact(got.to_pylist()) == _reference(data, "trace_summary", {"trace_id": "x1"})
    assert len(calls) == 1 and calls[0] is not None  # the stored read's connection, with only the views it needs
