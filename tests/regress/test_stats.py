"""The paired bootstrap and the dual-threshold decision, on numbers worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from tracedag.pipeline.regress.model import Thresholds
from tracedag.pipeline.regress.stats import adjust, decide, draw_counts, paired_bootstrap, resampled_means


def test_counts_are_draws_with_replacement():
    counts = draw_counts(5, 1000, np.random.default_rng(1))
    assert counts.shape == (1000, 5)
    assert (counts.sum(axis=1) == 5).all()
    assert counts.max() > 1  # with replacement: some unit drawn twice
    assert abs(counts.mean() - 1.0) < 1e-12


def test_resampled_mean_skips_units_without_the_metric():
    diffs = np.array([[1.0, np.nan, 3.0]])
    counts = np.array([[2.0, 1.0, 0.0], [0.0, 3.0, 0.0], [1.0, 1.0, 1.0]])
    means = resampled_means(diffs, counts)
    assert means[0, 0] == 1.0  # unit 1 drawn but has no value; units 0, 0
    assert np.isnan(means[1, 0])  # only the unit without a value was drawn
    assert means[2, 0] == 2.0  # (1 + 3) / 2


def test_constant_difference_gives_a_point_interval_and_zero_differences_never_exclude_zero():
    diffs = np.array([[-0.5] * 8, [0.0] * 8])
    got = paired_bootstrap(diffs, 500, 0.95, seed=3)
    assert got.delta.tolist() == [-0.5, 0.0]
    assert got.low[0] == got.high[0] == -0.5
    assert got.low[1] == got.high[1] == 0.0
    assert got.pairs.tolist() == [8, 8]


def test_interval_is_seeded_and_matches_a_one_metric_loop():
    rng = np.random.default_rng(0)
    diffs = rng.normal(-0.3, 1.0, size=(3, 40))
    diffs[1, ::4] = np.nan
    a = paired_bootstrap(diffs, 2000, 0.9, seed=11)
    b = paired_bootstrap(diffs, 2000, 0.9, seed=11)
    c = paired_bootstrap(diffs, 2000, 0.9, seed=12)
    assert a.low.tolist() == b.low.tolist() and a.high.tolist() == b.high.tolist()
    assert a.low.tolist() != c.low.tolist()
    # the same draws, one metric at a time, by a plain loop
    counts = draw_counts(40, 2000, np.random.default_rng(11))
    for m in range(3):
        row = diffs[m]
        means = []
        for w in counts:
            known = ~np.isnan(row)
            means.append(float((w * np.where(known, row, 0)).sum() / (w * known).sum()))
        low, high = np.quantile(means, [0.05, 0.95])
        assert a.low[m] == pytest.approx(low) and a.high[m] == pytest.approx(high)
    assert a.delta[1] == pytest.approx(np.nanmean(diffs[1]))
    assert a.pairs[1] == 30


def test_interval_covers_the_true_mean_at_about_the_nominal_rate():
    rng = np.random.default_rng(5)
    diffs = rng.normal(0.2, 1.0, size=(400, 60))  # 400 independent experiments as "metrics"
    got = paired_bootstrap(diffs, 1000, 0.9, seed=1)
    covered = ((got.low <= 0.2) & (got.high >= 0.2)).mean()
    assert 0.83 <= covered <= 0.95


HIGHER = Thresholds(warn=0.1, fail=0.3, direction="higher")
LOWER_REL = Thresholds(warn_rel=0.1, fail_rel=0.25, direction="lower")
EITHER = Thresholds(warn=0.1, fail=0.2, direction="either")


@pytest.mark.parametrize(("delta", "significant", "base", "t", "want"), [
    (-0.5, True, 4.0, HIGHER, "fail"),        # big drop, significant
    (-0.2, True, 4.0, HIGHER, "warn"),        # between the levels
    (-0.5, False, 4.0, HIGHER, "ok"),         # big drop but zero not excluded: no alert
    (-0.05, True, 4.0, HIGHER, "ok"),         # significant but the effect is small
    (0.5, True, 4.0, HIGHER, "improved"),     # better, not an alert
    (30.0, True, 100.0, LOWER_REL, "fail"),   # latency +30% with baseline 100: fail at 25
    (15.0, True, 100.0, LOWER_REL, "warn"),
    (-30.0, True, 100.0, LOWER_REL, "improved"),
    (-0.25, True, 0.8, EITHER, "fail"),       # a changed path: either direction
    (0.25, True, 0.8, EITHER, "fail"),
])
def test_dual_threshold(delta, significant, base, t, want):
    assert decide(delta, significant, base, t) == want


def test_a_zero_level_disables_that_level():
    only_fail = Thresholds(warn=0.0, fail=0.3, direction="higher")
    assert decide(-0.2, True, 4.0, only_fail) == "ok"
    assert decide(-0.4, True, 4.0, only_fail) == "fail"


def test_p_value_agrees_with_the_interval_and_resolves_small_values():
    rng = np.random.default_rng(2)
    diffs = rng.normal(0.0, 1.0, size=(300, 25)) + rng.normal(0, 0.4, size=(300, 1))
    got = paired_bootstrap(diffs, 999, 0.95, seed=4)
    excluded = (got.low > 0) | (got.high < 0)
    assert 0 < excluded.sum() < 300
    assert (excluded == (got.p < 0.05)).mean() > 0.95  # normal approximation vs percentile interval
    strong = paired_bootstrap(np.full((1, 30), -1.0) + rng.normal(0, 0.5, size=(1, 30)), 999, 0.95, seed=1)
    assert strong.p[0] < 1e-6  # far below 1 / B: survives an adjustment over many metrics
    constant = paired_bootstrap(np.array([[-0.5] * 6, [0.0] * 6]), 200, 0.95, seed=1)
    assert constant.p.tolist() == [0.0, 1.0]


def test_benjamini_hochberg_and_holm_by_hand():
    p = np.array([0.01, 0.04, 0.03, 0.5, np.nan])
    assert adjust(p, "bh")[:4] == pytest.approx([0.04, 0.04 * 4 / 3, 0.04 * 4 / 3, 0.5])
    assert adjust(p, "holm")[:4] == pytest.approx([0.04, 0.09, 0.09, 0.5])
    assert np.isnan(adjust(p, "bh")[4])
    assert adjust(p, "none")[:4].tolist() == p[:4].tolist()
