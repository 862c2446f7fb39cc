"""Issue 31: a named query over a store whose newest builds are not all stored yet (a live collector's backlog)
computes the traces not stored from the SQL over views restricted to them; up to ``mixed.COPY_TRACES`` traces,
the rows of the tables sorted by trace id are copied first. Both ways give the SQL's rows."""

from __future__ import annotations

import pytest

from tests.queries.test_materialized import _assert_mixed_equal, four_stored_conversations
from tests.score.score_support import StoreBuilder, agent_turn
from tracedag.pipeline.dag.build import build_store
from tracedag.pipeline.score.runner import score_store
from tracedag.pipeline.store import mixed


@pytest.mark.parametrize("copy_traces", [mixed.COPY_TRACES, 0])
def test_traces_not_stored_yet_are_computed_over_copies_or_in_place_alike(tmp_path_factory, tmp_path, monkeypatch,
                                                                          copy_traces):
    monkeypatch.setattr(mixed, "COPY_TRACES", copy_traces)
    data = tmp_path / "data"
    b = four_stored_conversations(tmp_path_factory, data)
    b.spans(agent_turn("a2", "conv-a1", 9_000_000, "lookup") + agent_turn("a0", "conv-a1", 500_000, "plan"))
    build_store(data, idle_seconds=0)  # built, not stored: conv-a1's three turns are computed
    _assert_mixed_equal(data, {"a0", "a1", "a2"})


def test_narrowed_reads_the_files_holding_the_traces_and_gives_their_rows(tmp_path):
    """Each raw table's rows of the traces asked, from only the files that hold one of them: the rows filtering
    the whole table gives (every build of those traces), none for traces in no file."""
    import pyarrow as pa

    from tracedag.pipeline.store.views import _LATEST, connect

    data = tmp_path / "data"
    b = StoreBuilder(data)
    for i, c in enumerate(("a1", "x1", "y1")):  # three batches: spans in three files, three builds
        b.spans(agent_turn(c, f"conv-{c}", 1_000_000 * (i + 1), "search"))
        build_store(data, idle_seconds=0)
    score_store(data)
    b.spans(agent_turn("a1", "conv-a1", 9_000_000, "lookup"))  # a1 again: a second build of it
    build_store(data, idle_seconds=0)
    con = connect(data, shared_macros=False)
    try:
        for ids in (["a1"], ["a1", "y1"], ["nope"]):
            con.register("asked", pa.table({"trace_id": pa.array(ids, pa.string())}))
            sources = mixed.narrowed(con, data, "asked")
            assert set(sources) == set(_LATEST)
            for table, source in sources.items():
                got = sorted(map(repr, con.sql(f"select * from {source}").fetchall()))
                want = sorted(map(repr, con.sql(f"select * from {table}_all where trace_id in "
                                                f"(select trace_id from asked)").fetchall()))
                assert got == want, (table, ids)
                assert (ids == ["nope"]) == (not want), table
            assert "x1" not in repr(con.sql(f"select trace_id from {sources['spans']}").fetchall())
            if ids == ["a1"]:  # the spans of x1 and y1 are in other files: those are not read
                assert sources["spans"].count(".parquet'") < len(list((data / "tables" / "spans").rglob("*.parquet")))
    finally:
        con.close()
