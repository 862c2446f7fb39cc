"""#31 ``connect(data, tables=...)``: a connection with only the raw views of the tables a reader names (what
``tracedag show`` reads one trace on), the same rows as ``connect``'s; the named queries' macros refused on it."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from tests.score.score_support import StoreBuilder, agent_turn
from tracedag.pipeline.dag.build import build_store
from tracedag.pipeline.dag.show import SHOWN_TABLES, load_shown
from tracedag.pipeline.score.runner import score_store
from tracedag.pipeline.store import freshness
from tracedag.pipeline.store.procdb import SEEN
from tracedag.pipeline.store.query_macros import data_of
from tracedag.pipeline.store.views import connect


@pytest.fixture(scope="module")
def scored(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("raw-views") / "data"
    b = StoreBuilder(data)
    b.spans(agent_turn("a1", "conv-1", 1_000_000, "search") + agent_turn("b1", "conv-2", 2_000_000, "fetch"))
    build_store(data, idle_seconds=0)
    score_store(data)
    return data


def _views(con: duckdb.DuckDBPyConnection) -> set[str]:
    """The views ``con`` reads: its own catalog's and its view set's (``procdb.SEEN``)."""
    return {str(r[0]) for r in con.execute(f"select view_name from duckdb_views() where not internal and {SEEN}").fetchall()}


def test_only_the_named_tables_raw_views_are_made_with_the_same_rows(scored: Path) -> None:
    wanted = ["traces", "dag_nodes", "evaluations", "materialized_traces", "determinism", "no such-table"]
    con = connect(scored, tables=wanted)
    whole = connect(scored)
    try:
        # refined tables get their raw view only; a derived table without files (determinism) none
        assert _views(con) == {"traces_all", "dag_nodes_all", "evaluations", "materialized_traces"}
        assert data_of(con) == scored
        for view in ("traces_all", "dag_nodes_all", "materialized_traces"):
            sql = f"select * from {view} order by all"
            assert con.sql(sql).fetchall() == whole.sql(sql).fetchall() != []
        assert {"traces", "spans", "step_scores", "materialized_failures"} <= _views(whole)
    finally:
        con.close()
        whole.close()


def test_shown_tables_answer_the_stored_rows_freshness(scored: Path) -> None:
    con = connect(scored, tables=SHOWN_TABLES)
    try:
        assert "materialized_failures" not in _views(con) and "materialized_propagation" in _views(con)
        # the store's stored rows are current whichever views a connection has (the answer is kept per store)
        assert freshness._freshness_now(con, scored, freshness._listed(scored))[0].fresh
        assert con.sql("select count(*) from spans_all").fetchall() == [(6,)]
    finally:
        con.close()
    shown = load_shown(scored, "a1")
    assert [n["span_id"] for n in shown.nodes] == ["a1-r", "a1-t", "a1-l"]
    assert shown.cause is not None and shown.cause.failed_span_id == "a1-t"


def test_the_named_queries_macros_need_every_view(scored: Path) -> None:
    for flags in ({"query_macros": True}, {"declare_macros": True}):
        with pytest.raises(ValueError, match="refined views"):
            connect(scored, tables=["traces"], **flags)  # type: ignore[arg-type]
