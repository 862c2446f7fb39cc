"""A live round scores from the recent part of the store and writes what a full scoring would."""

import shutil
import time
from pathlib import Path

import pytest

from bench.gen import requests
from tests.dag.spanbuild import q
from tracedag.pipeline.dag import build_store
from tracedag.pipeline.ingest.direct import ingest_requests
from tracedag.pipeline.score import score_store
from tracedag.pipeline.score.runner import LiveRound

SCORES = "select trace_id, span_id, metric, score, rule_name, taxonomy_l3 from step_scores order by all"


def _add(data, seed):
    ingest_requests(data, requests(600, seed), received_unix_nano=time.time_ns())
    return build_store(data, idle_seconds=0)


def _live(built):
    return LiveRound(built.build_id if built.traces_built else None, built.received_from)


@pytest.fixture(scope="module")
def first_round(tmp_path_factory):
    """A store of seed 1's requests, built and scored by a live round (its build's hint), made once per module (only
    ever copied); its build, and what the round scored. A round scores ~2 s CPU whatever these sizes: the tests
    start from this one instead of each doing it again."""
    data = tmp_path_factory.mktemp("live") / "data"
    built = _add(data, 1)
    return data, built, score_store(data, live=_live(built))


def _copy(first_round, dest: Path) -> Path:
    return Path(shutil.copytree(first_round[0], dest))


def test_live_rounds_score_what_a_full_scoring_does(first_round, tmp_path):
    live, whole = _copy(first_round, tmp_path / "live"), tmp_path / "whole"
    _, built, first = first_round
    assert first.builds == built.traces_built  # only this round's build
    _add(whole, 1)
    for seed in (2, 3):
        built = _add(live, seed)
        _add(whole, seed)
        assert score_store(live, live=_live(built)).builds == built.traces_built  # only this round's build
        assert built.plan == "incremental" and built.received_from is not None
    score_store(whole)
    scores = q(whole, SCORES)
    assert q(live, SCORES) == scores and len(scores) > 1000
    assert q(live, "select count(*) from step_scores where score <= 2") == q(
        whole, "select count(*) from step_scores where score <= 2") != [(0,)]


def test_a_round_also_scores_the_builds_an_earlier_round_left(first_round, tmp_path):
    data = _copy(first_round, tmp_path / "data")
    left = _add(data, 2)  # built, never scored (the collector stopped between build and score)
    third = _add(data, 3)
    stats = score_store(data, live=_live(third))  # the hint covers the third build only
    assert stats.builds == left.traces_built + third.traces_built
    assert q(data, "select count(*) from dag_nodes n anti join step_scores s using (trace_id, span_id)") == [(0,)]


def test_rounds_that_store_nothing_share_one_connection(first_round, tmp_path, monkeypatch):
    """Live rounds that leave the named queries' results to the store's thread score on one kept connection, its
    views following the files each round wrote (same rows as a full scoring), with nothing of a round left on it;
    a round that fails closes it, and the next connects again."""
    from tracedag.pipeline.score import runner

    live, whole = _copy(first_round, tmp_path / "live"), tmp_path / "whole"
    _add(whole, 1)
    kept = []
    for seed in (2, 3):
        built = _add(live, seed)
        _add(whole, seed)
        stats = score_store(live, live=LiveRound(built.build_id, built.received_from, materialize=False))
        assert stats.builds == built.traces_built and stats.materialized is None
        assert runner.ROUND_CONNECTION.current is not None and runner.ROUND_CONNECTION.current[1] == live
        kept.append(runner.ROUND_CONNECTION.current[2])
        assert kept[-1].execute("select view_name from duckdb_views() where temporary and not internal").fetchall() == []
    assert kept[0] is kept[1]
    score_store(whole)
    assert q(live, SCORES) == q(whole, SCORES)

    def fail(*args, **kwargs):
        raise RuntimeError("a rule pass that fails")

    built = _add(live, 4)
    with monkeypatch.context() as m:
        m.setattr(runner, "score_rules", fail)
        with pytest.raises(RuntimeError):
            score_store(live, live=LiveRound(built.build_id, built.received_from, materialize=False))
    assert runner.ROUND_CONNECTION.current is None
    score_store(live, live=LiveRound(built.build_id, built.received_from, materialize=False))
    assert runner.ROUND_CONNECTION.current is not None and runner.ROUND_CONNECTION.current[2] is not kept[0]


def test_a_round_reads_the_spans_files_of_its_arrivals(first_round, tmp_path, monkeypatch):
    """A live round's scan reads the spans files holding arrivals since its build's earliest (per their footers), not
    every file, and scans the same facts as over every file."""
    from tracedag.pipeline.score import inputs, scan
    from tracedag.pipeline.store.files import parquet_files
    from tracedag.pipeline.store.views import connect

    data = _copy(first_round, tmp_path / "data")
    built = _add(data, 2)
    con = connect(data, shared_macros=False)
    try:
        relation = scan.recent_spans(con, built.received_from)
        assert 0 < relation.count(".parquet'") < len(parquet_files(data, "spans"))
        assert scan.recent_spans(con, 0) == "spans_all"
        assert scan.recent_spans(con, 2**62) == "spans_all"  # no file left
        pending = inputs.pending_rule_builds(con)
        assert pending.num_rows == built.traces_built
        narrowed = scan.read_scan(con, pending, None, built.received_from)
        monkeypatch.setattr(scan, "recent_spans", lambda con, received_from: "spans_all")
        every = scan.read_scan(con, pending, None, built.received_from)
    finally:
        con.close()
    order = [("trace_id", "ascending"), ("span_id", "ascending")]
    assert narrowed.facts.sort_by(order).equals(every.facts.sort_by(order)) and narrowed.facts.num_rows > 500
    assert narrowed.defs == every.defs and narrowed.calls == every.calls


def test_a_store_without_evaluations_asks_no_evaluation_query(first_round, tmp_path, monkeypatch):
    """No evaluations file: nothing to map, and the query (which reads every latest build's steps) is not run."""
    from tracedag.pipeline.score import inputs
    from tracedag.pipeline.store.files import parquet_files

    data = _copy(first_round, tmp_path / "data")
    assert parquet_files(data, "evaluations") == []
    built = _add(data, 2)

    def asked(*args, **kwargs):
        raise AssertionError("the evaluations were queried")

    monkeypatch.setattr(inputs, "evaluation_rows", asked)
    stats = score_store(data, live=LiveRound(built.build_id, built.received_from, materialize=False))
    assert stats.builds == built.traces_built and stats.evaluations.unmatched_step == 0
