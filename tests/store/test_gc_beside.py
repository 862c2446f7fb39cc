"""The live collector's collection beside its rounds (``store.swap.collect_beside``), on a real Parquet store.

Its new files are written with no lock held while builds, scorings and other collections go on: whatever ran
meanwhile, the views answer what they would have without the collection, and no row is lost or doubled.
"""

from __future__ import annotations

import shutil

import pytest

from tests.store import test_gc
from tests.store.test_gc import N_TRACES, NO_GC, raw_and_live, resend, score_file, snapshot
from tracedag.pipeline.dag import build_store
from tracedag.pipeline.store import swap
from tracedag.pipeline.store.files import parquet_files
from tracedag.pipeline.store.gc import GcSettings, staging_root

MERGE_ALL = GcSettings(max_small_files=1)
"""Merge every table's small files: the churned store has a few per table."""

TABLES = ("traces", "dag_nodes", "dag_edges", "step_scores")


churned = test_gc.churned  # the store after test_gc.churn (superseded builds, scores on several), once a module


@pytest.fixture
def two_copies(churned, tmp_path):
    """Two copies of the churned store: one collected, one left as the reference."""
    copies = tmp_path / "collected", tmp_path / "reference"
    for copy in copies:
        shutil.copytree(churned, copy)
    return copies


def _meanwhile(monkeypatch, action) -> list[str]:
    """Run ``action`` once, when the collection starts writing its new files (no lock held); return the tables
    whose new files were written."""
    prepared: list[str] = []
    ran: list[bool] = []
    real = swap.prepare

    def prepare(root, d, table, *args, **kwargs):
        if not ran:
            ran.append(True)  # before the action: a collection run by it calls this too
            action()
        prepared.append(table)
        return real(root, d, table, *args, **kwargs)

    monkeypatch.setattr(swap, "prepare", prepare)
    return prepared


def _new_builds_named(rows: dict, known: set[str]) -> dict:
    """``rows`` (``snapshot``) with every build id not in ``known`` written ``new`` (two copies' later builds have
    ids of their own)."""
    def one(v):
        return "new" if isinstance(v, str) and v.startswith("build-") and v not in known else v
    return {name: [tuple(one(v) for v in row) for row in table] for name, table in rows.items()}


def _build_ids(data) -> set[str]:
    return {f.name.rsplit("-", 1)[0] for f in parquet_files(data, "traces")} | {
        v for table in snapshot(data).values() for row in table for v in row
        if isinstance(v, str) and v.startswith("build-")}


def _build_more(data) -> None:
    """A later build of a third of the traces (one span of each sent again) and scores on it."""
    resend(data, range(1, N_TRACES, 3), 20)
    later = build_store(data, idle_seconds=0, gc=NO_GC)
    score_file(data, [(f"t{k:03d}", "c1", later.build_id) for k in range(1, N_TRACES, 3)])


def test_collected_alone_the_views_are_unchanged_and_only_live_rows_are_left(two_copies):
    data, _ = two_copies
    before = snapshot(data)
    assert raw_and_live(data, "dag_nodes")[0] > raw_and_live(data, "dag_nodes")[1]  # superseded rows to drop
    stats = swap.collect_beside(data, MERGE_ALL)
    assert snapshot(data) == before
    for name in TABLES:
        raw, live = raw_and_live(data, name)
        assert raw == live, name
    assert stats.merged.get("dag_nodes", 0) >= 2 and stats.rows_dropped.get("dag_nodes", 0) > 0
    assert len(parquet_files(data, "dag_nodes")) == 1 and not staging_root(data).exists()


def test_a_build_and_scores_written_while_it_collects_are_kept(two_copies, monkeypatch):
    """The files a build and a scoring write meanwhile are no input of the collection: the swap keeps them."""
    data, reference = two_copies
    known = _build_ids(data)
    prepared = _meanwhile(monkeypatch, lambda: _build_more(data))
    swap.collect_beside(data, MERGE_ALL)
    assert "dag_nodes" in prepared
    _build_more(reference)  # the same build and scores, with no collection
    assert _new_builds_named(snapshot(data), known) == _new_builds_named(snapshot(reference), known)
    assert _build_ids(data) - known  # the later build is there
    for name in TABLES:  # the new build's rows are all there; only the rows dead before it were dropped
        assert raw_and_live(data, name)[1] == raw_and_live(reference, name)[1], name
        assert raw_and_live(data, name)[0] < raw_and_live(reference, name)[0], name


def test_a_table_another_collection_took_meanwhile_is_left_as_it_is(two_copies, monkeypatch):
    """Another collection (a ``tracedag build`` beside the collector) merges the same files first: the swap would
    add their rows a second time, so the table is left as the other one made it."""
    data, _ = two_copies
    before = snapshot(data)
    _meanwhile(monkeypatch, lambda: swap.collect(data, compact=True))
    stats = swap.collect_beside(data, MERGE_ALL)
    assert snapshot(data) == before
    for name in TABLES:
        raw, live = raw_and_live(data, name)
        assert raw == live, name  # no row twice
    assert stats.merged == {} and stats.rewritten == {}
