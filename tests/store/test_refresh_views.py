"""``views.refresh_views``: a connection kept across the steps of a score round reads the store as it is.

A local store's views glob their directories when a query is planned, so new and removed files of a table are read
without a refresh; what needs one is a view whose statement changed: a core table that had no files (an empty
relation of its schema) got some, a derived table appeared, or the refined views were restricted. A score round
makes one connection for its rules, data edges and stored results, and reads what a new connection would.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

import tracedag.pipeline.score.memory as memory_module
import tracedag.pipeline.score.provenance as provenance_module
import tracedag.pipeline.score.runner as runner_module
from tests.queries.test_materialized import assert_materialized_equal
from tests.score.score_support import StoreBuilder, agent_turn
from tracedag.pipeline.dag.build import build_store
from tracedag.pipeline.score import score_store
from tracedag.pipeline.store import views
from tracedag.pipeline.store.views import connect, refresh_views, restrict_traces


def _count(con: duckdb.DuckDBPyConnection, sql: str) -> int:
    return int(con.execute(sql).fetchall()[0][0])


def _fresh(data: Path, sql: str) -> int:
    con = connect(data, shared_macros=False)
    try:
        return _count(con, sql)
    finally:
        con.close()


def test_a_kept_connection_reads_new_files_and_refreshes_only_changed_views(tmp_path: Path) -> None:
    data = tmp_path / "data"
    b = StoreBuilder(data)
    b.spans(agent_turn("a1", "conv-a", 1_000_000, "search"))
    build_store(data, idle_seconds=0)
    con = connect(data, shared_macros=False)
    try:
        assert not refresh_views(con, data)  # nothing changed: nothing made again
        b.spans(agent_turn("b1", "conv-b", 2_000_000, "lookup"))
        build_store(data, idle_seconds=0)
        assert _count(con, "select count(*) from traces") == 2  # new files of a table: read by the glob
        assert not refresh_views(con, data)
        score_store(data)  # step_scores had no files (its view is empty); materialized_* tables appear
        assert _count(con, "select count(*) from step_scores") == 0
        assert refresh_views(con, data)
        for sql in ("select count(*) from step_scores", "select count(*) from materialized_traces"):
            assert _count(con, sql) == _fresh(data, sql) > 0
        assert not refresh_views(con, data)
        con.register("one", con.sql("select 'a1' as trace_id").to_arrow_table())
        restrict_traces(con, "one")
        assert _count(con, "select count(*) from traces") == 1
        assert refresh_views(con, data)  # the refined views read the whole store again
        assert _count(con, "select count(*) from traces") == 2
    finally:
        con.close()


def test_a_score_round_makes_one_connection_and_stores_what_the_sql_gives(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    b = StoreBuilder(data)
    b.spans(agent_turn("a1", "conv-a", 1_000_000, "search") + agent_turn("a2", "conv-a", 2_000_000, "lookup")
            + agent_turn("b1", "conv-b", 3_000_000, "plan"))
    build_store(data, idle_seconds=0)
    made: list[Path] = []

    def counted(data: Path, *args: object, **kwargs: object) -> duckdb.DuckDBPyConnection:
        made.append(Path(data))
        return views.connect(data, *args, **kwargs)  # type: ignore[arg-type]

    for module in (runner_module, provenance_module, memory_module):
        monkeypatch.setattr(module, "connect", counted)
    stats = score_store(data)  # the first round: step_scores and materialized_* have no files when it connects
    assert stats.steps and stats.failures_by_category
    assert stats.materialized is not None and stats.materialized.traces == 3
    assert made == [data]
    assert_materialized_equal(data)
    assert not list((data / "state").glob("duckdb-spill-*"))  # removed once the connection closed
