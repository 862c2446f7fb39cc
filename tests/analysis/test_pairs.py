"""Mean pairwise Jaccard: exact up to PAIR_SAMPLE pairs of distinct sets, a seeded estimate above,
the same threshold and seed in Python (response consistency) and SQL (replay coverage)."""

from __future__ import annotations

import itertools
import math

import pytest

from tracedag import queries
from tracedag.pipeline.analysis.determinism import analyze_runs
from tracedag.pipeline.analysis.pairs import PAIR_SAMPLE, SEED, bound, jaccard, mean_pairwise_jaccard
from tracedag.pipeline.analysis.response import (
    OFFLINE_METHOD,
    OFFLINE_SAMPLED_METHOD,
    TokenJaccardScorer,
    tokens,
)
from tracedag.pipeline.analysis.trajectories import Run

EXACT = 10**12  # a sample size no group reaches: the exact (quadratic) mean, as before the sampling


def brute_force(sets):
    """The definition: the mean of Jaccard over every pair of members."""
    pairs = list(itertools.combinations(sets, 2))
    return sum(jaccard(a, b) for a, b in pairs) / len(pairs)


def distinct_sets(n):
    """n distinct sets whose pairwise Jaccard varies (overlapping windows of a shared vocabulary)."""
    return [frozenset(f"w{(i * 7 + k) % 97}" for k in range(1 + i % 5)) | {f"own{i}"} for i in range(n)]


def test_the_threshold_is_the_number_of_distinct_pairs():
    d_max = max(d for d in range(2, 1000) if d * (d - 1) // 2 <= PAIR_SAMPLE)
    assert d_max == 283
    sets = distinct_sets(d_max)
    exact = mean_pairwise_jaccard(sets * 3, "k")  # 849 members, 283 distinct sets: still exact
    assert not exact.estimated and exact.pairs == 849 * 848 // 2
    assert exact.value == pytest.approx(brute_force(sets * 3), abs=1e-12)
    assert mean_pairwise_jaccard(distinct_sets(d_max + 1), "k").estimated


def test_small_groups_keep_their_hand_computed_values():
    a, b, c = frozenset("ab"), frozenset("bc"), frozenset()
    assert mean_pairwise_jaccard([a, b, a], "k").value == pytest.approx(5 / 9)
    assert mean_pairwise_jaccard([c, c], "k").value == 1.0  # two empty sets are identical
    assert mean_pairwise_jaccard([a, c], "k").value == 0.0
    with pytest.raises(ValueError):
        mean_pairwise_jaccard([a], "k")


def test_the_estimate_is_within_its_bound_and_deterministic():
    sets = distinct_sets(900)
    exact = mean_pairwise_jaccard(sets, "g", sample=EXACT)
    assert not exact.estimated and exact.value == pytest.approx(brute_force(sets), abs=1e-12)
    est = mean_pairwise_jaccard(sets, "g")
    assert est.estimated and est.pairs == PAIR_SAMPLE
    assert abs(est.value - exact.value) < bound(0.999)
    assert mean_pairwise_jaccard(sets, "g") == est  # seeded: the same figure on every run
    other = mean_pairwise_jaccard(sets, "another group")  # the key seeds the sample
    assert other.value != est.value and abs(other.value - exact.value) < bound(0.999)


def test_the_stated_bound():
    # Hoeffding: 2 exp(-2 m eps^2) = 1 - confidence
    eps = bound(0.999, PAIR_SAMPLE)
    assert eps == pytest.approx(0.0097, abs=5e-5)
    assert 2 * math.exp(-2 * PAIR_SAMPLE * eps**2) == pytest.approx(0.001)


def test_the_sql_uses_the_same_sample_size_and_seed():
    sql = queries.load("determinism")
    assert f"select {PAIR_SAMPLE} as pair_sample, '{SEED}' as seed" in sql


def test_offline_scorer_labels_an_estimate():
    scorer = TokenJaccardScorer()
    small = scorer.measure(["a b", "a b", "a"], "k")
    assert small.method == OFFLINE_METHOD and small.value == pytest.approx(3.0)
    responses = [" ".join(sorted(s)) for s in distinct_sets(900)]
    est = scorer.measure(responses, "k")
    exact = 1 + 3 * mean_pairwise_jaccard([tokens(r) for r in responses], "k", sample=EXACT).value
    assert est.method == OFFLINE_SAMPLED_METHOD
    assert abs(est.value - exact) < 3 * bound(0.999)
    assert scorer.agreement(responses) == scorer.measure(responses, "").value


def _run(i, sets, response=None):
    r = Run(run_key=f"r{i:05d}", agent="ag", agent_version=None, scenario="s", variant_id=None,
            replay_index=i, start_ns=i)
    r.nodes, r.node_failed, r.node_turn = ["A"], [False], [0]
    r.actions = ["tool"] * len(sets)  # one action set: its coverage stays exact
    r.action_inputs = sorted(sets)
    r.responses, r.trace_ids = [response], [f"t{i}"]
    return r


def _sql_row(runs):
    rows = analyze_runs(runs).tables["determinism"].to_pylist()
    return next(r for r in rows if r["comparison"] == "replays")


@pytest.mark.parametrize("distinct", [283, 284])
def test_sql_coverage_exact_or_estimated_at_the_same_threshold(distinct):
    sets = [frozenset(f"{w}()" for w in s) for s in distinct_sets(distinct)]
    runs = [_run(i, s) for i, s in enumerate(sets + sets[:50])]
    row = _sql_row(runs)
    exact = brute_force([frozenset(r.action_inputs) for r in runs])
    if distinct == 283:
        assert row["coverage_estimated"] == []
        assert row["action_input_coverage"] == pytest.approx(exact, abs=1e-12)
    else:
        assert row["coverage_estimated"] == ["action_input"]
        assert abs(row["action_input_coverage"] - exact) < bound(0.999)
        assert row["action_input_coverage"] != pytest.approx(exact, abs=1e-12)  # really a sample
    assert row["node_coverage"] == 1.0  # one distinct node set: exact


def test_estimates_are_reported_and_repeat_exactly():
    sets = [frozenset(f"{w}()" for w in s) for s in distinct_sets(700)]
    runs = [_run(i, s, response=" ".join(sorted(s))) for i, s in enumerate(sets)]
    first = analyze_runs(runs).tables
    again = analyze_runs(runs).tables
    assert first["determinism"].to_pylist() == again["determinism"].to_pylist()
    row = first["determinism"].to_pylist()[0]
    assert row["response_consistency_method"] == OFFLINE_SAMPLED_METHOD
    exact = 1 + 3 * brute_force([tokens(r.final_response) for r in runs])
    assert abs(row["response_consistency"] - exact) < 3 * bound(0.999)
    agent = first["determinism_agent"].to_pylist()[0]
    assert agent["coverage_estimated"] == ["action_input"]
    assert agent["response_consistency_method"] == OFFLINE_SAMPLED_METHOD


def test_small_groups_are_reported_exact():
    runs = [_run(0, {"a()"}, "x y"), _run(1, {"a()", "b()"}, "x")]
    row = _sql_row(runs)
    assert row["coverage_estimated"] == []
    assert row["action_input_coverage"] == pytest.approx(0.5)
    assert row["response_consistency_method"] == OFFLINE_METHOD
    assert row["response_consistency"] == pytest.approx(2.5)
