"""Issue 31: each trace's newest stored round, kept per listing of the state files (``store.current_rounds``),
answers a whole-store poll instead of joining every stored round on the latest builds; a later round, a
collection and a new build give the answers the SQL gives, as before."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.queries.test_materialized import _exact, _reference, assert_materialized_equal, references
from tests.score.score_support import StoreBuilder, agent_turn
from tracedag.pipeline.dag.build import build_store
from tracedag.pipeline.score.runner import score_store
from tracedag.pipeline.store import current_rounds, freshness, materialized
from tracedag.pipeline.store.gc import GcSettings
from tracedag.pipeline.store.querying import run_named
from tracedag.pipeline.store.views import connect


def _kept(data) -> list:
    return sorted((data / "state" / current_rounds.KEPT).glob("current-*.parquet"))


def _from_the_state(data) -> list[dict]:
    """The newest state row of each trace, computed from the state's view (not from the kept table)."""
    con = connect(data)
    try:
        return con.sql(f"""select trace_id, arg_max(build_id, mat_round) as build_id, max(mat_round) as mat_round,
                                  arg_max(signature, mat_round) as signature
                           from {materialized.STATE} group by trace_id order by trace_id""").to_arrow_table().to_pylist()
    finally:
        con.close()


def _poll(data) -> list[dict]:
    """A poll as a new process makes it (nothing remembered in this one)."""
    freshness._FRESH.clear()
    current_rounds._LAST.clear()
    return run_named(data, "root_causes").to_pylist()


def _assert_poll_is_the_sql(data) -> None:
    newest = _from_the_state(data)
    names = ("root_causes", "trace_summary")
    wants = references(data, [("root_causes", {}), *((name, {"trace_id": row["trace_id"]})
                                                      for row in newest for name in names)])
    assert _exact(_poll(data)) == wants[0]
    kept = _kept(data)
    assert len(kept) == 1  # the table of the listing now, the older ones removed
    assert pq.read_table(kept[0]).to_pylist() == newest
    # one trace: its newest round in this process's memory (the poll kept the table there), then looked up in the
    # kept file as a new process does (a lookup keeps nothing: cleared once, the memory stays empty)
    for in_memory in (True, False):
        if not in_memory:
            current_rounds._LAST.clear()
        for i, row in enumerate(newest):
            assert bool(current_rounds._LAST) == in_memory
            assert current_rounds.lookup(data, row["trace_id"]) == row["mat_round"]
            for j, name in enumerate(names):
                given = {"trace_id": row["trace_id"]}
                assert _exact(run_named(data, name, given).to_pylist()) == wants[1 + 2 * i + j], name


def test_later_rounds_and_a_collection_keep_the_poll_equal_to_the_sql(tmp_path):
    data = tmp_path / "data"
    sb = StoreBuilder(data)
    sb.spans(agent_turn("solo", "conv-solo", 500_000, "fetch"))
    turns = []
    for i in range(3):  # one turn a round: each round stores the conversation's earlier turns again
        sb.spans(agent_turn(f"t{i}", "conv-1", 1_000_000 * (i + 1), "search"))
        build_store(data, idle_seconds=0, gc=GcSettings(enabled=False))
        score_store(data)
        _assert_poll_is_the_sql(data)
        turns.append({r["trace_id"]: r["turn_index"] for r in _poll(data)})
    assert turns[-1] == {"solo": 1, "t0": 1, "t1": 2, "t2": 3}  # the newest round of each turn is read
    build_store(data, idle_seconds=0, compact=True)  # the replaced rounds' rows are dropped, the state rewritten
    _assert_poll_is_the_sql(data)
    assert_materialized_equal(data)


@pytest.fixture(scope="module")
def two_conversations(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store of two one-turn conversations (a1 in conv-a, x1 in conv-x), built and scored (rows stored), once per
    module: only ever copied."""
    data = tmp_path_factory.mktemp("two") / "data"
    StoreBuilder(data).spans(agent_turn("a1", "conv-a", 1_000_000, "search")
                             + agent_turn("x1", "conv-x", 2_000_000, "fetch"))
    build_store(data, idle_seconds=0)
    score_store(data)
    return data


def _two_conversations_scored(two_conversations: Path, tmp_path: Path) -> tuple[Path, StoreBuilder]:
    """A copy of ``two_conversations`` (no reader ran on it yet) and a builder of it, to send later turns."""
    data = tmp_path / "data"
    shutil.copytree(two_conversations, data)
    return data, StoreBuilder(data)


def test_a_build_not_stored_yet_is_computed_and_the_next_round_is_read(two_conversations, tmp_path):
    data, sb = _two_conversations_scored(two_conversations, tmp_path)
    _assert_poll_is_the_sql(data)
    sb.spans(agent_turn("a2", "conv-a", 3_000_000, "lookup"))
    build_store(data, idle_seconds=0)  # built, not stored: a1's conversation is computed from the SQL
    assert _exact(_poll(data)) == _reference(data, "root_causes", {})
    score_store(data)
    _assert_poll_is_the_sql(data)


def test_a_trace_whose_newest_stored_round_is_not_of_its_latest_build_is_computed(two_conversations, tmp_path):
    """A round stored after another with an older build of a trace (no tracedag writes that; a state row
    written by hand here): the stored rows of its latest build are not the newest, so the SQL answers it."""
    data, _ = _two_conversations_scored(two_conversations, tmp_path)
    state = pq.read_table(next((data / "tables" / materialized.STATE).glob("*.parquet")))
    row = state.filter(pa.compute.equal(state.column("trace_id"), "a1"))
    newer = row.set_column(row.schema.get_field_index("build_id"), "build_id", pa.array(["an-older-build"]))
    newer = newer.set_column(newer.schema.get_field_index("mat_round"), "mat_round",
                             pa.array([row.column("mat_round")[0].as_py() + 1], pa.int64()))
    pq.write_table(newer, data / "tables" / materialized.STATE / "part-by-hand.parquet")
    cases = [("root_causes", {}), ("trace_summary", {}), ("failures", {})]
    wants = references(data, cases)
    got = _exact(_poll(data))
    assert got == wants[0] and "a1" in {r["trace_id"] for r in got}
    for (name, given), want in zip(cases[1:], wants[1:], strict=True):
        assert _exact(run_named(data, name, given).to_pylist()) == want, name


def test_a_round_keeps_the_next_listings_table_from_the_last_one_and_its_own_rows(two_conversations, tmp_path):
    """``advance`` (each state write calls it): the table a round keeps from the previous listing's and its state
    rows, before any reader, is the one a reader computes from every state file; after anything else changed the
    listing it keeps nothing."""
    data, sb = _two_conversations_scored(two_conversations, tmp_path)
    _assert_poll_is_the_sql(data)
    state_dir = data / "tables" / materialized.STATE
    before, files, last = current_rounds.listing(data), set(state_dir.glob("*.parquet")), _kept(data)[0]
    last_bytes = last.read_bytes()
    sb.spans(agent_turn("a2", "conv-a", 3_000_000, "lookup"))
    build_store(data, idle_seconds=0)
    score_store(data)  # stores conv-a again: a1's row is replaced, a2's added, x1's kept
    kept = _kept(data)
    assert kept != [last] and len(kept) == 1 and pq.read_table(kept[0]).to_pylist() == _from_the_state(data)
    added = sorted(set(state_dir.glob("*.parquet")) - files)
    assert len(added) == 1
    kept[0].unlink()  # as if the round had not kept it: advancing the previous listing's table gives it again
    last.write_bytes(last_bytes)
    assert current_rounds.advance(data, before, pq.read_table(added[0]))
    assert [pq.read_table(k).to_pylist() for k in _kept(data)] == [_from_the_state(data)]
    assert not current_rounds.advance(data, before[:1] + ("another file",), pq.read_table(added[0]))
    _assert_poll_is_the_sql(data)
