"""What the regression gate works with: metric families, alert levels, one result per metric, the error.

A metric id is a family, optionally broken down by step type, step name, taxonomy category or
root-cause step: ``workflow_score``, ``step_score[type=tool]``, ``failure_rate[category=execution]``.
Every family has a direction (which way is worse) and default warn/fail thresholds, absolute in the
metric's unit and/or relative to the baseline mean; ``config.RegressConfig`` overrides them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from tracedag.schemas.errors import TracedagError

Direction = Literal["higher", "lower", "either"]
"""``higher``: higher is better (a drop is a regression); ``lower``: lower is better; ``either``: any change."""
Status = Literal["fail", "warn", "ok", "improved", "absent", "insufficient"]
STATUS_ORDER: dict[str, int] = {"fail": 0, "warn": 1, "absent": 2, "insufficient": 3, "improved": 4, "ok": 5}


class RegressError(TracedagError):  # type: ignore[misc,unused-ignore]
    """A usage or data error of ``tracedag regress`` (exit 2): bad selection or config, nothing to compare."""


@dataclass(frozen=True)
class Thresholds:
    """Warn and fail levels of one metric: an alert needs the effect at least this large (and the CI
    clear of zero). The effective level is the larger of the absolute one and ``rel`` x |baseline mean|."""

    warn: float = 0.0
    fail: float = 0.0
    warn_rel: float = 0.0
    fail_rel: float = 0.0
    direction: Direction = "higher"
    enabled: bool = True

    def level(self, which: Literal["warn", "fail"], baseline_mean: float) -> float:
        """The effect size that ``which`` needs, given the baseline mean."""
        absolute = self.warn if which == "warn" else self.fail
        relative = self.warn_rel if which == "warn" else self.fail_rel
        return max(absolute, relative * abs(baseline_mean))


@dataclass(frozen=True)
class Family:
    """A metric family: what it measures, its unit of pairing and its default thresholds."""

    name: str
    description: str
    thresholds: Thresholds
    whole_run: bool = False
    """Every trace has it; absent on one side is a data error (exit 2), not a listed row."""
    unit: Literal["case", "scenario"] = "case"


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("workflow_score", "mean workflow score of the case's traces (1-5)",
           Thresholds(warn=0.1, fail=0.25, direction="higher"), whole_run=True),
    Family("pass_rate", "share of the case's traces that pass (workflow score >= pass threshold)",
           Thresholds(warn=0.05, fail=0.10, direction="higher"), whole_run=True),
    Family("latency_p50", "median trace duration of the case (ms)",
           Thresholds(warn=2.0, fail=5.0, warn_rel=0.15, fail_rel=0.30, direction="lower"), whole_run=True),
    Family("latency_p95", "95th percentile trace duration of the case (ms)",
           Thresholds(warn=2.0, fail=5.0, warn_rel=0.25, fail_rel=0.50, direction="lower"), whole_run=True),
    Family("validation_pass_rate", "share of the case's runs that pass structural validation (tracedag validate)",
           Thresholds(warn=0.05, fail=0.10, direction="higher")),
    Family("tokens", "input + output tokens per trace",
           Thresholds(warn_rel=0.10, fail_rel=0.25, direction="lower")),
    Family("cost_usd", "USD per trace: tokens at the price list of queries/_costs.sql (span_costs)",
           Thresholds(warn_rel=0.10, fail_rel=0.25, direction="lower")),
    Family("step_score", "mean over the scored steps of a type or name of their score (a step's score: the minimum "
                         "over its step_scores rows; 1-5)",
           Thresholds(warn=0.15, fail=0.30, direction="higher")),
    Family("step_visits", "executions of a step type or name per trace (a changed path)",
           Thresholds(warn=0.10, fail=0.20, warn_rel=0.10, fail_rel=0.25, direction="either")),
    Family("step_latency_p95", "95th percentile duration of a step type or name in the case (ms)",
           Thresholds(warn=2.0, fail=5.0, warn_rel=0.25, fail_rel=0.50, direction="lower")),
    Family("failure_rate", "share of the case's steps failing with a taxonomy category",
           Thresholds(warn=0.03, fail=0.05, direction="lower")),
    Family("root_cause", "share of the case's traces whose root cause is a step",
           Thresholds(warn=0.05, fail=0.10, direction="lower")),
    Family("determinism", "trajectory consistency/coverage over the exact replays of a scenario (0-1)",
           Thresholds(warn=0.05, fail=0.15, direction="higher"), unit="scenario"),
)}


def family_of(metric_id: str) -> str:
    """``step_score[type=tool]`` -> ``step_score``; ``determinism[node_consistency]`` -> ``determinism``."""
    return metric_id.split("[", 1)[0]


@dataclass
class MetricResult:
    """The comparison of one metric over the paired units."""

    metric: str
    family: str
    direction: Direction
    pairs: int
    baseline_mean: float | None
    candidate_mean: float | None
    delta: float | None
    ci_low: float | None
    ci_high: float | None
    warn_at: float | None
    fail_at: float | None
    status: Status
    note: str = ""
    p_value: float | None = None
    """Two-sided paired-bootstrap p-value of a zero difference."""
    p_adjusted: float | None = None
    """The p-value adjusted over every compared metric (``correction``); the alert tests this."""

    @property
    def breakdown(self) -> str:
        """The part in brackets (``type=tool``), '' for an overall metric."""
        return self.metric[len(self.family) + 1:-1] if "[" in self.metric else ""


@dataclass
class Side:
    """One selection: its text and what it matched."""

    selector: str
    traces: int
    cases: int


@dataclass
class RegressResult:
    """Everything ``tracedag regress`` found."""

    baseline: Side
    candidate: Side
    pair_by: list[str]
    paired_cases: int
    paired_scenarios: int
    unpaired: dict[str, list[str]]
    metrics: list[MetricResult]
    resamples: int
    confidence: float
    seed: int
    strict: bool = False
    correction: str = "bh"
    notes: list[str] = field(default_factory=list)

    def alerts(self, level: Literal["fail", "warn"]) -> list[MetricResult]:
        """The metrics at ``level`` (fail) or at warn level or worse (warn: warn, absent, insufficient)."""
        if level == "fail":
            return [m for m in self.metrics if m.status == "fail"]
        return [m for m in self.metrics if m.status in ("warn", "absent", "insufficient")]

    @property
    def exit_code(self) -> int:
        """0 nothing fails; 1 a fail-level alert (with ``strict`` a warn-level one too)."""
        if self.alerts("fail") or (self.strict and self.alerts("warn")):
            return 1
        return 0
