"""Materialized named queries (issue 31): the rows stored at score time equal the SQL's.

The SQL definitions are the reference: on a copy of every fixture store (the query and RCA
fixtures, the demo's store) and after incremental build+score rounds, each materialized query read
through ``tracedag query`` (``run_named``) and through its table macro gives exactly the rows, in
order, that its SQL gives over the same store with the same parameters.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.demo.demo_support import DemoRun, private_demo
from tests.score.score_support import StoreBuilder, agent_turn
from tests.shared_dirs import copy_of, shared_dir
from tracedag import queries
from tracedag.pipeline.dag.build import build_store
from tracedag.pipeline.score.materialize import MaterializeStats, materialize
from tracedag.pipeline.score.runner import score_store
from tracedag.pipeline.store import freshness, materialized, mixed, mixedkept
from tracedag.pipeline.store.fetch import arrow
from tracedag.pipeline.store.query_macros import create_query_macros
from tracedag.pipeline.store.querying import bind_params, run_named, run_sql
from tracedag.pipeline.store.views import connect

CASES = [("failures", {}), ("propagation", {}), ("root_causes", {}), ("root_causes", {"per": "conversation"}),
         ("workflow_scores", {}), ("trace_summary", {})]


def _exact(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    """Rows with doubles rounded to 12 significant digits: DuckDB sums in parallel, so a weighted mean
    (workflow_score) may differ in its last bits between two runs of the very same SQL."""
    return [{k: float(f"{v:.12g}") if isinstance(v, float) else v for k, v in r.items()} for r in rows]


def _reference(data: Path, name: str, given: dict[str, str]) -> list[dict[str, object]]:
    """The rows of the query's SQL text itself, run on a plain connection (never the stored rows)."""
    return references(data, [(name, given)])[0]


def references(data: Path, cases: list[tuple[str, dict[str, str]]]) -> list[list[dict[str, object]]]:
    """``_reference`` of each case, all on one plain connection (connecting binds every view: ~0.2 s CPU each)."""
    con = connect(data)
    try:
        return [_exact(arrow(con, queries.load(name), bind_params(queries.describe(name), given)).to_pylist())
                for name, given in cases]
    finally:
        con.close()


def _reads_stored(data: Path, name: str, given: dict[str, str]) -> bool:
    con = connect(data, shared_macros=False)  # named_statement calls no shared query macro
    try:
        values = bind_params(queries.describe(name), given)
        return freshness.named_statement(con, data, name, values) is not None
    finally:
        con.close()


def check_cases(data: Path, cases: list[tuple[str, dict[str, str]]], stored: bool) -> list[list[dict[str, object]]]:
    """Each case: whether it reads its materialized rows is ``stored``; ``run_named`` and its table macro give the
    rows of its SQL; return those rows. Asked on one connection, the SQL run on a second and the macros made on a
    third: a connection per case and per way cost two thirds of this check's CPU."""
    wants = references(data, cases)
    asked, macros = connect(data, shared_macros=False), connect(data)  # named_statement calls no shared macro
    try:
        for (name, given), want in zip(cases, wants, strict=True):
            values = bind_params(queries.describe(name), given)
            reads = freshness.named_statement(asked, data, name, values) is not None
            assert reads == stored, f"{name} {given} reads its materialized rows: {reads}"
            assert _exact(run_named(data, name, given).to_pylist()) == want, f"{name} {given}"
            args = ", ".join(f"{k} := '{v}'" for k, v in given.items())
            sql = f"select * from {name}({args})"
            create_query_macros(macros, sql)
            assert _exact(arrow(macros, sql).to_pylist()) == want, f"{name}() {given}"
    finally:
        asked.close()
        macros.close()
    return wants


def materialized_answers(data: Path) -> list[list[dict[str, object]]]:
    """``assert_materialized_equal``'s check; the rows of each of ``CASES`` (``run_named``'s, the SQL's)."""
    answers = check_cases(data, CASES, stored=True)
    assert any(answers)
    return answers


def assert_materialized_equal(data: Path, expect_rows: bool = True) -> int:
    """Every case: ``run_named`` and the macro read stored rows, and they equal the SQL's; return the rows."""
    total = sum(map(len, check_cases(data, CASES, stored=True)))
    if expect_rows:
        assert total > 0
    return total


def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "store"
    shutil.copytree(src, dst)
    return dst


def _store_four_conversations(data: Path) -> None:
    StoreBuilder(data).spans([s for i, c in enumerate(("a1", "x1", "y1", "z1"))
                              for s in agent_turn(c, f"conv-{c}", 1_000_000 * (i + 1), "search")])
    build_store(data, idle_seconds=0)
    assert score_store(data).materialized is not None


def four_stored_conversations(factory: pytest.TempPathFactory, data: Path) -> StoreBuilder:
    """At ``data``, a store of four one-turn conversations (a1, x1, y1, z1), built and scored (their rows stored):
    a copy of one made once per test run (``tests/shared_dirs.py``); its builder, to send later turns."""
    copy_of(shared_dir(factory, "four-stored-conversations", _store_four_conversations), data)
    return StoreBuilder(data)


@dataclass(frozen=True)
class Stored:
    """A copy of a fixture store after its first materialization round, made once per module. The tests that only
    read read ``shared``, where the round ran (a read keeps its freshness answer and the current rounds in
    ``state/``, nothing else); a test that writes takes a copy of ``pristine``, copied from it right after the
    round."""

    shared: Path
    pristine: Path
    stats: MaterializeStats
    read_before: bool  # whether failures() read stored rows before the round
    kept: list[pa.Table]  # the current rounds' tables the round kept, read before any reader ran


@pytest.fixture(scope="module")
def stored(query_store: Path, rca_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Stored]:
    """``stored(fixture, part=None)``: the fixture store ``fixture`` materialized by ``materialize`` (in parts of
    ``part`` traces; None: its default), once per module."""
    made: dict[tuple[str, int | None], Stored] = {}
    sources = {"query_store": query_store, "rca_store": rca_store}

    def get(fixture: str, part: int | None = None) -> Stored:
        if (fixture, part) not in made:
            root = tmp_path_factory.mktemp(f"{fixture}-{part}")
            data = _copy(sources[fixture], root)
            before = _reads_stored(data, "failures", {})
            stats = materialize(data, []) if part is None else materialize(data, [], part=part)
            kept = [pq.read_table(f) for f in sorted((data / "state" / freshness.KEPT).glob("current-*.parquet"))]
            pristine = Path(shutil.copytree(data, root / "pristine"))
            made[fixture, part] = Stored(data, pristine, stats, before, kept)
        return made[fixture, part]

    return get


@pytest.mark.parametrize("fixture", ["query_store", "rca_store"])
def test_fixture_stores_materialized_rows_equal_the_sql(fixture: str, stored: Callable[..., Stored]) -> None:
    s = stored(fixture)
    assert not s.read_before  # nothing materialized yet: the SQL answers
    assert s.stats.full and s.stats.traces > 0
    assert_materialized_equal(s.shared)


def test_demo_store_is_materialized_by_its_scoring_and_equals_the_sql(demo_newcomer: DemoRun, tmp_path: Path) -> None:
    data = private_demo(demo_newcomer, tmp_path / "newcomer").data  # tracedag demo, run once per test run
    assert materialized.has_rounds(data)
    assert_materialized_equal(data)


def test_other_parameters_compute_from_the_sql(stored: Callable[..., Stored]) -> None:
    check_cases(stored("query_store").shared, [
        ("failures", {"fail_threshold": "1.5"}), ("root_causes", {"strategy": "weighted"}),
        ("root_causes", {"per": "step"}), ("propagation", {"per": "conversation"}),
        ("trace_summary", {"pass_threshold": "4.5"})], stored=False)


def test_one_trace_and_a_time_window_read_the_stored_rows(stored: Callable[..., Stored]) -> None:
    check_cases(stored("query_store").shared, [
        (name, given) for name in ("failures", "root_causes", "trace_summary")
        for given in ({"trace_id": "t2-converge"}, {"since_ns": "1000"}, {"trace_id": "no-such-trace"})], stored=True)


def test_changed_human_labels_make_the_store_stale_until_the_next_round(stored: Callable[..., Stored],
                                                                        tmp_path: Path) -> None:
    data = _copy(stored("query_store").pristine, tmp_path)
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


def test_rows_materialized_by_other_sql_are_not_read_and_the_next_round_redoes_every_trace(
        stored: Callable[..., Stored], tmp_path: Path) -> None:
    data = _copy(stored("query_store").pristine, tmp_path)
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
    cases = [*CASES, ("failures", {"since_ns": "2500000"}), ("trace_summary", {"trace_id": "a1"}),
             ("root_causes", {"trace_id": "x1"})]
    wants = references(data, cases)
    con = connect(data)
    try:
        state = freshness.freshness(con, data)
        assert state.usable and set(state.stale) == stale
        for (name, given), want in zip(CASES, wants[:len(CASES)], strict=True):
            values = bind_params(queries.describe(name), given)
            got = mixed.read(con, data, name, queries.load(name), values)
            assert got is not None and _exact(got.to_pylist()) == want, f"{name} {given}"
            con.close()
            con = connect(data)  # mixed.read restricts its connection's views
        one = {t: freshness.named_statement(con, data, "trace_summary", bind_params(
            queries.describe("trace_summary"), {"trace_id": t})) is not None for t in ("x1", "a1")}
        assert one == {"x1": True, "a1": False}
    finally:
        con.close()
    for (name, given), want in zip(cases, wants, strict=True):
        assert _exact(run_named(data, name, given).to_pylist()) == want, f"{name} {given}"


def test_a_store_whose_newest_builds_are_not_materialized_reads_stored_rows_and_computes_the_rest(
        tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    data = tmp_path / "data"
    b = four_stored_conversations(tmp_path_factory, data)
    assert materialized.has_rounds(data)
    # a later and an earlier turn of a1's conversation, built but not scored: its three turns are computed
    b.spans(agent_turn("a2", "conv-a1", 9_000_000, "lookup") + agent_turn("a0", "conv-a1", 500_000, "plan"))
    build_store(data, idle_seconds=0)
    _assert_mixed_equal(data, {"a0", "a1", "a2"})
    # every trace rebuilt (the previous builds collected): nothing is answered, the SQL runs alone
    build_store(data, idle_seconds=0, full=True)
    con = connect(data, shared_macros=False)
    try:
        assert not freshness.freshness(con, data).usable
    finally:
        con.close()
    assert _exact(run_named(data, "root_causes", {}).to_pylist()) == _reference(data, "root_causes", {})
    score_store(data)
    assert_materialized_equal(data)


def _freshness(data: Path) -> freshness.Freshness:
    freshness._FRESH.clear()  # as a new process: only what is kept on disk is remembered
    con = connect(data, shared_macros=False)
    try:
        return freshness.freshness(con, data)
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
    kept = list((data / "state" / freshness.KEPT).glob("fresh-*.json"))
    assert len(kept) == 1
    # the next process reads the kept answer instead of the tables: an answer written there is the one given
    kept[0].write_text(json.dumps({"usable": False, "stale": [], "traces": 3}))
    assert not _freshness(data).usable
    b.spans(agent_turn("a2", "conv-a1", 9_000_000, "lookup"))
    build_store(data, idle_seconds=0)  # a new build: a new listing, asked again
    assert set(_freshness(data).stale) == {"a1", "a2"}
    assert len(list((data / "state" / freshness.KEPT).glob("fresh-*.json"))) == 1
    build_store(data, idle_seconds=0, full=True)  # every trace rebuilt, the earlier builds collected
    assert not _freshness(data).usable
    score_store(data)
    assert _freshness(data).fresh
    assert_materialized_equal(data)


def _state_files(data: Path) -> list[Path]:
    return sorted((data / "tables" / materialized.STATE).glob("part-*.parquet"))


@pytest.mark.parametrize("fixture", ["query_store", "rca_store"])
def test_a_store_with_more_traces_than_a_part_is_stored_in_parts_that_equal_the_sql(
        fixture: str, stored: Callable[..., Stored]) -> None:
    """``tracedag score``'s first round of a store with more traces than a part stores them a part at a time (at
    10M spans one round of every trace took more than 19 GB and was killed): whole conversations in each part,
    each part's state with it, and the rows equal the SQL's."""
    s = stored(fixture, 2)
    data = s.shared
    traces = run_sql(data, "select count(*) as n, count(distinct coalesce(conversation_id, trace_id)) as c "
                           "from traces").to_pylist()[0]
    assert s.stats.full and s.stats.traces == traces["n"] > 2
    parts = run_sql(data, "select mat_round, count(*) as n, count(distinct conversation_key) as c "
                          "from materialized_traces group by mat_round").to_pylist()
    assert len(parts) == len(_state_files(data)) > 1  # one state file a part
    assert all(p["n"] <= 2 or p["c"] == 1 for p in parts)  # at most 2 traces, or one conversation with more
    assert sum(p["c"] for p in parts) == traces["c"]  # no conversation split between parts
    assert_materialized_equal(data)


def test_changed_labels_are_stored_again_in_parts_and_their_state_lands_at_once(stored: Callable[..., Stored],
                                                                                tmp_path: Path) -> None:
    """After the human labels change every trace is stored again; a store with more traces than a part is done in
    parts, and the state of every part is written after the last one, in one file: until then readers see the old
    signature and take the SQL, and an interrupted round leaves nothing that looks current."""
    data = _copy(stored("query_store").pristine, tmp_path)
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


def test_a_round_keeps_each_traces_newest_round_for_the_readers(stored: Callable[..., Stored]) -> None:
    """Each part's state advances the table of each trace's newest stored round kept for the state files'
    listing (``store.current_rounds``): the first reader after a round finds it instead of computing it."""
    s = stored("query_store", 2)
    assert len(s.kept) == 1  # read right after the round, before any reader ran: the round kept it
    want = run_sql(s.shared, "select trace_id, arg_max(mat_round, mat_round) as mat_round from materialized_traces "
                             "group by trace_id order by trace_id").to_pylist()
    got = s.kept[0].select(["trace_id", "mat_round"]).sort_by("trace_id").to_pylist()
    assert got == want  # this store's rows equal the SQL's: test_a_store_with_more_traces_than_a_part_...[query_store]


def test_a_poll_of_a_store_with_traces_waiting_makes_no_connection_for_the_stored_rows_alone(
        tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once this process knows the stored rows do not answer every trace (``known_freshness``), a whole-store read
    connects once (the stored rows plus the SQL), not first for the stored rows alone; one trace they answer is still
    read from them alone; the answers are the SQL's."""
    from tracedag.pipeline.store import querying

    data = tmp_path / "data"
    b = four_stored_conversations(tmp_path_factory, data)
    b.spans(agent_turn("a2", "conv-a1", 9_000_000, "lookup"))
    build_store(data, idle_seconds=0)  # built, not stored: conv-a1 is computed
    assert freshness.known_freshness(data) is None or not freshness.known_freshness(data).fresh
    run_named(data, "root_causes")  # the freshness answer is now kept
    known = freshness.known_freshness(data)
    assert known is not None and set(known.stale) == {"a1", "a2"}
    calls: list[object] = []
    real = querying.connect
    monkeypatch.setattr(querying, "connect", lambda *a, **k: calls.append(k.get("tables")) or real(*a, **k))
    mixedkept.forget(files=False)  # the rows the first poll computed: computed again (kept ones: test_mixed_kept)
    assert _exact(run_named(data, "root_causes").to_pylist()) == _reference(data, "root_causes", {})
    assert calls == [None]
    calls.clear()
    got = run_named(data, "trace_summary", {"trace_id": "x1"})
    assert _exact(got.to_pylist()) == _reference(data, "trace_summary", {"trace_id": "x1"})
    assert len(calls) == 1 and calls[0] is not None  # the stored read's connection, with only the views it needs
