"""Seeded paired bootstrap over units (cases or scenarios), vectorised over every metric at once.

For metrics m and paired units i with differences d[m, i] (candidate - baseline; NaN where either
side lacks the value), one resample draws n unit indices with replacement; the resampled mean of m
is sum_i w_i d[m, i] / sum_i w_i [d[m, i] known], w_i = how often unit i was drawn. All resamples
are one (B x n) count matrix W, so the B x M means are two matrix products. The interval is the
percentile interval of those means at the configured confidence. The same draws serve every metric
(the resampling unit is the case, as in a paired test), and the same seed gives the same intervals.

The two-sided p-value of a zero difference is ``erfc(|delta| / (se sqrt 2))`` with ``se`` the
standard deviation of the resampled means (the bootstrap standard error; a normal approximation),
so p-values far below ``1 / B`` are resolved: with dozens of metrics per comparison the gate
adjusts them over all compared metrics (Benjamini-Hochberg by default: a false discovery rate of
``1 - confidence``; Holm: the family-wise error), and an empirical p-value could never go below
``2 / (B + 1)``, too coarse once multiplied by the number of metrics. Without correction,
``p < 1 - confidence`` agrees with "the percentile interval excludes zero" up to the interval's
skew. Constant differences have ``se = 0``: p is 0 for a non-zero difference, 1 for none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tracedag.pipeline.regress.model import Status, Thresholds

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Interval:
    """Mean paired difference and its bootstrap interval, per metric (NaN where no unit is paired)."""

    delta: FloatArray
    low: FloatArray
    high: FloatArray
    pairs: npt.NDArray[np.int64]
    p: FloatArray


def draw_counts(units: int, resamples: int, rng: np.random.Generator) -> FloatArray:
    """``W[b, i]``: how often unit ``i`` is drawn in resample ``b`` (each row sums to ``units``)."""
    idx = rng.integers(0, units, size=(resamples, units))
    counts = np.zeros((resamples, units), dtype=np.float64)
    np.add.at(counts, (np.repeat(np.arange(resamples), units), idx.ravel()), 1.0)
    return counts


def resampled_means(diffs: FloatArray, counts: FloatArray) -> FloatArray:
    """``(B, M)`` resampled means of the ``(M, n)`` differences (NaN: unit without the metric)."""
    known = ~np.isnan(diffs)
    total = counts @ np.where(known, diffs, 0.0).T
    weight = counts @ known.T.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        means: FloatArray = total / weight
    return means


def paired_bootstrap(diffs: FloatArray, resamples: int, confidence: float, seed: int) -> Interval:
    """Mean difference and percentile CI of every row of ``diffs`` (metrics x units)."""
    metrics, units = diffs.shape
    pairs = (~np.isnan(diffs)).sum(axis=1).astype(np.int64)
    with np.errstate(invalid="ignore"):
        delta = np.where(pairs > 0, np.nansum(diffs, axis=1) / np.maximum(pairs, 1), np.nan)
    if units == 0 or metrics == 0:
        nan = np.full(metrics, np.nan)
        return Interval(delta, nan, nan.copy(), pairs, nan.copy())
    means = resampled_means(diffs, draw_counts(units, resamples, np.random.default_rng(seed)))
    alpha = (1.0 - confidence) / 2.0
    low, high, p = (np.full(metrics, np.nan) for _ in range(3))
    for m in range(metrics):
        column = means[:, m]
        column = column[~np.isnan(column)]
        if column.size:
            low[m], high[m] = np.quantile(column, [alpha, 1.0 - alpha])
            p[m] = p_value(float(delta[m]), float(column.std(ddof=1)) if column.size > 1 else 0.0)
    return Interval(delta, low, high, pairs, p)


def p_value(delta: float, se: float) -> float:
    """Two-sided normal p-value of ``delta`` with standard error ``se`` (0 or 1 when ``se`` is 0)."""
    if se <= 1e-12 * max(1.0, abs(delta)):
        return 1.0 if abs(delta) <= 1e-12 else 0.0
    return math.erfc(abs(delta) / (se * math.sqrt(2.0)))


def adjust(p: FloatArray, method: str) -> FloatArray:
    """p-values adjusted over the family (NaN entries are left out): ``bh`` Benjamini-Hochberg,
    ``holm`` Holm-Bonferroni, ``none`` as they are."""
    out = p.copy()
    known = np.flatnonzero(~np.isnan(p))
    m = known.size
    if method == "none" or m == 0:
        return out
    order = known[np.argsort(p[known], kind="stable")]
    ranked = p[order]
    if method == "bh":
        scaled = ranked * m / np.arange(1, m + 1)
        adjusted = np.minimum.accumulate(scaled[::-1])[::-1]
    elif method == "holm":
        scaled = ranked * (m - np.arange(m))
        adjusted = np.maximum.accumulate(scaled)
    else:
        raise ValueError(f"unknown correction {method!r}")
    out[order] = np.minimum(adjusted, 1.0)
    return out


def decide(delta: float, significant: bool, baseline_mean: float, t: Thresholds) -> Status:
    """The dual threshold: an alert needs the effect beyond its level AND the difference significant
    (the adjusted p-value below 1 - confidence: zero excluded), on the worse side for the metric's
    direction (either side for ``either``)."""
    worse, better = _signed(delta, significant, t)
    if worse is not None:
        if worse >= t.level("fail", baseline_mean) and t.level("fail", baseline_mean) > 0:
            return "fail"
        if worse >= t.level("warn", baseline_mean) and t.level("warn", baseline_mean) > 0:
            return "warn"
    if better is not None and better >= max(t.level("warn", baseline_mean), 1e-12):
        return "improved"
    return "ok"


def _signed(delta: float, significant: bool, t: Thresholds) -> tuple[float | None, float | None]:
    """(effect in the worse direction if significant there, same for the better direction)."""
    below, above = significant and delta < 0, significant and delta > 0
    if t.direction == "higher":
        return (-delta if below else None), (delta if above else None)
    if t.direction == "lower":
        return (delta if above else None), (-delta if below else None)
    return (abs(delta) if below or above else None), None
