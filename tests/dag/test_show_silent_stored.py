"""``tracedag show`` reads a trace's silent producer from ``root_causes``' stored rows when they are current.

Computed over the one trace shown, ``root_causes`` cost ~0.35 s CPU (most of it DuckDB planning the
query), and every view and the shared macros had to be made for it (~0.1 s more): on a fresh store the
stored rows (per trace, greedy) answer instead, and ``show`` prints the same.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.dag.test_show_byid import materialized_copy
from tests.queries.test_rca_provenance import _show
from tests.queries.test_rca_provenance import store as provenance_store  # noqa: F401  (the fixture)
from tracedag.pipeline.dag import show_stored
from tracedag.pipeline.store.views import connect

TRACES = ("t2", "t3", "t4", "t5", "t6", "t7")


@pytest.fixture(scope="module")
def stored(provenance_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    return materialized_copy(provenance_store, tmp_path_factory.mktemp("prov-stored") / "data")


def test_the_stored_rows_answer_on_the_fresh_copy_alone(provenance_store: Path, stored: Path) -> None:  # noqa: F811
    for data, answers in ((stored, True), (provenance_store, False)):
        con = connect(data)
        try:
            assert (show_stored.silent_statement(con, "t3") is not None) is answers
        finally:
            con.close()


@pytest.mark.parametrize("trace_id", TRACES)
def test_show_prints_the_same_from_the_stored_rows(provenance_store: Path, stored: Path,  # noqa: F811
                                                   trace_id: str) -> None:
    assert _show(stored, trace_id) == _show(provenance_store, trace_id)


def test_the_silent_producer_is_read_without_the_shared_macros(stored: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tracedag.pipeline.dag import show

    def refuse(con: object) -> None:
        raise AssertionError("the shared macros were made")

    monkeypatch.setattr(show, "create_shared_macros", refuse)
    assert "silent producer: lookup_order wrote the value of tracking_no" in _show(stored, "t3")
