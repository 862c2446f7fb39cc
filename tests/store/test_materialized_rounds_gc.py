"""Issue 31: a conversation's later turn stores its earlier turns' results again (same builds, a newer round);
the rows of the replaced rounds are dead, and the collection drops them instead of keeping every round."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.queries.test_materialized import assert_materialized_equal
from tests.score.score_support import StoreBuilder, agent_turn
from tracedag.pipeline.dag.build import build_store
from tracedag.pipeline.score.runner import score_store
from tracedag.pipeline.store import materialized
from tracedag.pipeline.store.gc import GcSettings
from tracedag.pipeline.store.views import connect

TURNS = 4


def _count(data, sql: str) -> tuple:
    con = connect(data, shared_macros=False)  # the SQL calls no shared query macro
    try:
        return tuple(con.execute(sql).fetchall()[0])
    finally:
        con.close()


def _rows(data, table: str) -> tuple[int, int]:
    """(rows, rows of the newest round of each trace) of a materialized table."""
    return _count(data, f"""
        select count(*), count(*) filter (where x.mat_round = n.newest)
        from {table} x join (select trace_id, max(mat_round) as newest from {materialized.STATE} group by trace_id) n
        using (trace_id)""")


@pytest.fixture(scope="module")
def turn_by_turn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A conversation of ``TURNS`` turns, one a round (built, scored, stored: each round stores every turn again),
    beside a conversation of one turn stored once; no collection after these builds. Made once per module: only
    ever copied."""
    data = tmp_path_factory.mktemp("turns") / "data"
    sb = StoreBuilder(data)
    sb.spans(agent_turn("solo", "conv-solo", 500_000, "fetch"))
    for i in range(TURNS):
        sb.spans(agent_turn(f"t{i}", "conv-1", 1_000_000 * (i + 1), "search"))
        build_store(data, idle_seconds=0, gc=GcSettings(enabled=False))
        score_store(data)
    return data


def _conversation_turn_by_turn(turn_by_turn: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(turn_by_turn, tmp_path / "data"))


def test_the_collection_drops_the_rows_of_replaced_rounds_and_the_answers_stay(turn_by_turn, tmp_path):
    data = _conversation_turn_by_turn(turn_by_turn, tmp_path)
    stored = TURNS * (TURNS + 1) // 2 + 1  # turn i stored by rounds i..TURNS-1, and the solo turn once
    assert _count(data, f"select count(*), count(distinct trace_id) from {materialized.STATE}") == (stored, TURNS + 1)
    assert _rows(data, "materialized_failures") == (stored, TURNS + 1)  # one failing tool a turn
    before = assert_materialized_equal(data)

    gc = build_store(data, idle_seconds=0, compact=True).gc  # what a build does once the files are many

    assert gc is not None and gc.rows_dropped.get(materialized.STATE) == stored - (TURNS + 1)
    assert _count(data, f"select count(*), count(distinct trace_id) from {materialized.STATE}") == (TURNS + 1,) * 2
    for name in materialized.SPECS:
        rows, newest = _rows(data, materialized.table_name(name))
        assert rows == newest, name  # only the newest round of each trace is left
    assert assert_materialized_equal(data) == before  # and it answers what the SQL computes, as before


def test_a_later_round_after_the_collection_replaces_the_kept_rows_in_turn(turn_by_turn, tmp_path):
    data = _conversation_turn_by_turn(turn_by_turn, tmp_path)
    build_store(data, idle_seconds=0, compact=True)
    StoreBuilder(data).spans(agent_turn("t9", "conv-1", 9_000_000, "search"))  # one more turn, its round
    build_store(data, idle_seconds=0)
    score_store(data)
    assert _count(data, f"select count(*) from {materialized.STATE}")[0] == 2 * TURNS + 2
    build_store(data, idle_seconds=0, compact=True)
    assert _count(data, f"select count(*), count(distinct trace_id) from {materialized.STATE}") == (TURNS + 2,) * 2
    assert_materialized_equal(data)
