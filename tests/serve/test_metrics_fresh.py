"""#31 ``/metrics`` cold on a fresh store: the figures are read through the raw views of the tables they need
(no refined view, no shared macro), each trace's latest build from the current rounds; the text is the one the
named queries' SQL gives, and a store whose builds the current rounds do not pin one-to-one falls back.
"""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path

import pytest

from tests.score.score_support import StoreBuilder, agent_turn, span
from tracedag.pipeline.dag.build import build_store
from tracedag.pipeline.score.runner import score_store
from tracedag.pipeline.serve import metrics
from tracedag.pipeline.store import freshness, materialized
from tracedag.pipeline.store.views import connect
from tracedag.schemas.layout import tables_dir


def without_timing(text: str) -> str:
    return re.sub(r"^tracedag_metrics_compute_seconds .*$", "", text, flags=re.M)


def _sql_text(store: Path, tmp_path: Path) -> str:
    """The text of a copy of ``store`` without its stored rows (every named query from its SQL)."""
    copy = tmp_path / "sql"
    shutil.copytree(store, copy)
    for d in tables_dir(copy).glob(materialized.PREFIX + "*"):
        shutil.rmtree(d)
    return without_timing(metrics.compute(copy))


def test_a_fresh_store_is_read_without_the_refined_views(serve_store: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[Path] = []
    real = metrics.create_views
    monkeypatch.setattr(metrics, "create_views", lambda con, data, **k: (made.append(data), real(con, data, **k)))
    fresh = without_timing(metrics.compute(serve_store))
    assert made == []  # the stored rows answered: the raw views of READ alone
    assert fresh == _sql_text(serve_store, tmp_path)
    assert made == [tmp_path / "sql"]  # no stored rows: every view and the shared macros


def test_a_duplicated_build_row_falls_back_to_the_latest_builds_aggregate(serve_store: Path, tmp_path: Path,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    copy = tmp_path / "dup"
    shutil.copytree(serve_store, copy)
    first = sorted((tables_dir(copy) / "traces").glob("*.parquet"))[0]
    shutil.copy(first, first.with_name("dup-" + first.name))  # every row of that file twice in traces_all
    with caplog.at_level(logging.INFO, logger=metrics.__name__):
        text = without_timing(metrics.compute(copy))
    assert "latest builds aggregated" in caplog.text
    assert "tracedag_traces_built " in text
    assert text == without_timing(metrics.compute(serve_store))


def test_a_trace_built_twice_reads_its_latest_build_from_the_current_rounds(tmp_path: Path,
                                                                            caplog: pytest.LogCaptureFixture) -> None:
    data = tmp_path / "data"
    b = StoreBuilder(data)
    b.spans(agent_turn("a1", "conv-1", 1_000_000, "search") + agent_turn("b1", "conv-2", 2_000_000, "fetch"))
    build_store(data, idle_seconds=0)
    b.spans([span("a1", "a1-late", "a1-r", step_type="llm", step_name="think", start_time_unix_nano=1_000_050,
                  end_time_unix_nano=1_000_070, duration_ns=20, conversation_id="conv-1", received_unix_nano=3_000_000)])
    build_store(data, idle_seconds=0)  # a1 built again: its first build's row stays in traces_all
    score_store(data)
    con = connect(data)
    try:
        assert con.execute("select count(*), count(distinct trace_id) from traces_all").fetchall() == [(3, 2)]
        assert freshness.fresh(con, data)
    finally:
        con.close()
    with caplog.at_level(logging.INFO, logger=metrics.__name__):
        text = without_timing(metrics.compute(data))
    assert "latest builds aggregated" not in caplog.text
    assert "tracedag_traces_built 2\n" in text and 'step_name="think"' in text
    assert text == _sql_text(data, tmp_path)
