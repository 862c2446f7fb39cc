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

from tracedag.pipeline.serve import metrics
from tracedag.pipeline.store import materialized
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
