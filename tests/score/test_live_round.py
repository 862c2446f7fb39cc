"""A live round scores from the recent part of the store and writes what a full scoring would."""

import time

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


def test_live_rounds_score_what_a_full_scoring_does(tmp_path):
    live, whole = tmp_path / "live", tmp_path / "whole"
    for seed in (1, 2, 3):
        built = _add(live, seed)
        _add(whole, seed)
        assert score_store(live, live=_live(built)).builds == built.traces_built  # only this round's build
        if seed > 1:
            assert built.plan == "incremental" and built.received_from is not None
    score_store(whole)
    assert q(live, SCORES) == q(whole, SCORES) and len(q(whole, SCORES)) > 1000
    assert q(live, "select count(*) from step_scores where score <= 2") == q(
        whole, "select count(*) from step_scores where score <= 2") != [(0,)]


def test_a_round_also_scores_the_builds_an_earlier_round_left(tmp_path):
    first = _add(tmp_path, 1)
    score_store(tmp_path, live=_live(first))
    left = _add(tmp_path, 2)  # built, never scored (the collector stopped between build and score)
    third = _add(tmp_path, 3)
    stats = score_store(tmp_path, live=_live(third))  # the hint covers the third build only
    assert stats.builds == left.traces_built + third.traces_built
    assert q(tmp_path, "select count(*) from dag_nodes n anti join step_scores s using (trace_id, span_id)") == [(0,)]
