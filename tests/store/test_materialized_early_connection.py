"""Issue 31: a reader that connected before the store's first stored round landed (a live poll while the
collector stores it) has no view of the stored rows; it reads the SQL, and the answer kept for other readers
is the store's, not that connection's."""

from __future__ import annotations

import shutil

from tests.score.score_support import StoreBuilder, agent_turn
from tracedag.pipeline.dag.build import build_store
from tracedag.pipeline.score.runner import score_store
from tracedag.pipeline.store import freshness, materialized
from tracedag.pipeline.store.query_macros import create_query_macros
from tracedag.pipeline.store.views import connect

ROOT_CAUSES = "select * from root_causes() order by all"


def _store(tmp_path):
    data = tmp_path / "data"
    sb = StoreBuilder(data)
    sb.spans(agent_turn("t1", "conv-1", 1_000_000, "search"))
    sb.spans(agent_turn("t2", "conv-2", 2_000_000, "fetch"))
    build_store(data, idle_seconds=0)
    score_store(data)
    for table in (*map(materialized.table_name, materialized.SPECS), materialized.STATE):  # scored, none stored
        shutil.rmtree(data / "tables" / table)
    return data


def test_a_connection_made_before_the_first_round_reads_the_sql(tmp_path):
    data = _store(tmp_path)
    early = connect(data)  # its views: no stored rows yet
    score_store(data)  # the first round is stored meanwhile (nothing to score: it stores them all)
    assert (data / "tables" / materialized.STATE).is_dir()
    assert freshness.freshness(early, data) == freshness.Freshness(False)  # before: CatalogException
    later = connect(data)
    assert freshness.fresh(later, data)  # what a new connection finds, and keeps for the next reader
    create_query_macros(early, ROOT_CAUSES)
    create_query_macros(later, ROOT_CAUSES)
    rows = later.sql(ROOT_CAUSES).fetchall()
    assert rows and early.sql(ROOT_CAUSES).fetchall() == rows  # the stored rows and the SQL agree
    assert freshness.fresh(connect(data), data)  # the early connection's answer was not kept for others


def test_an_answer_kept_by_another_reader_does_not_send_an_early_connection_to_the_stored_rows(tmp_path):
    data = _store(tmp_path)
    early = connect(data)
    score_store(data)
    assert (data / "tables" / materialized.STATE).is_dir()
    assert freshness.fresh(connect(data), data)  # another reader found the store fresh and kept it
    assert freshness.named_statement(early, data, "root_causes", {}) is None  # before: the stored rows' SQL
    create_query_macros(early, ROOT_CAUSES)
    assert early.sql(ROOT_CAUSES).fetchall()  # before: Catalog Error, materialized_traces does not exist
