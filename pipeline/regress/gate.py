"""``run_regress``: select both sides, pair their cases, compare every metric, decide the alerts.

Cases: the traces of a side grouped by the ``pair_by`` labels (scenario, and replay index when both
sides have one); a case of one side without its partner is listed as unpaired, never compared.
Determinism is compared per scenario (its unit is a set of replays). Each metric gets the mean
paired difference, a seeded paired-bootstrap interval and the dual-threshold decision (``stats``).

Two sides that are different agents (their traces' agent names do not overlap, as the demo's
constrained and permissive agents) name their own agent step differently, so a metric keyed by it
(``step_visits[agent=court_booking.constrained]``) could never pair: each side's agent step is then
keyed ``AGENT_KEY`` (``step_visits[agent=(agent)]``), on both sides, and a note says so.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt
import polars as pl

from tracedag.pipeline.regress import determinism as det
from tracedag.pipeline.regress.config import RegressConfig
from tracedag.pipeline.regress.facts import StoreFacts, case_values, load_facts, selection_connection
from tracedag.pipeline.regress.model import (
    FAMILIES,
    MetricResult,
    RegressError,
    RegressResult,
    Side,
    family_of,
)
from tracedag.pipeline.regress.selection import parse_selection, select_traces
from tracedag.pipeline.regress.stats import adjust, decide, paired_bootstrap

AGENT_KEY = "(agent)"
"""The name both sides' agent steps are compared under when the sides are different agents."""
COUNTING = {"step_visits", "failure_rate", "root_cause"}
"""Families that are 0 in a case without the step (or category): a missing value is a zero."""
_FAMILY_ORDER = {name: i for i, name in enumerate(FAMILIES)}


def _frame(table: object) -> pl.DataFrame:
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    return frame


def effective_pair_by(pair_by: tuple[str, ...], base: pl.DataFrame, cand: pl.DataFrame) -> tuple[list[str], list[str]]:
    """``pair_by`` without ``replay_index`` when a side has none; the notes saying so."""
    keys, notes = [], []
    for key in pair_by:
        if key == "replay_index" and (base[key].null_count() == base.height or cand[key].null_count() == cand.height):
            notes.append("replay_index is not on both sides: cases are paired by the other labels only")
            continue
        keys.append(key)
    return keys, notes


def case_keys(labels: pl.DataFrame, pair_by: list[str]) -> pl.DataFrame:
    """``trace_id, case`` with case = ``label=value|...`` over ``pair_by``."""
    parts = [pl.format(f"{k}={{}}", pl.col(k).cast(pl.String).fill_null("-")) for k in pair_by]
    return labels.select("trace_id", pl.concat_str(parts, separator="|").alias("case"))


def _sides(data: Path, baseline: str, candidate: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    base = _frame(select_traces(data, parse_selection(baseline, "baseline"), "baseline"))
    cand = _frame(select_traces(data, parse_selection(candidate, "candidate"), "candidate"))
    both = set(base["trace_id"]) & set(cand["trace_id"])
    if both:
        raise RegressError(f"the baseline and candidate selections share {len(both)} trace(s); "
                           "select disjoint runs (e.g. service_version=1.0 vs service_version=1.1)")
    return base, cand


def _pairing(base: pl.DataFrame, cand: pl.DataFrame, config: RegressConfig,
             ) -> tuple[list[str], list[str], pl.DataFrame, pl.DataFrame, list[str], dict[str, list[str]]]:
    pair_by, notes = effective_pair_by(config.pair_by, base, cand)
    cb, cc = case_keys(base, pair_by), case_keys(cand, pair_by)
    b_cases, c_cases = set(cb["case"]), set(cc["case"])
    common = sorted(b_cases & c_cases)
    if not common:
        raise RegressError(
            f"no common cases when pairing by {', '.join(pair_by)}: baseline has {_some(b_cases)}, "
            f"candidate has {_some(c_cases)} (a trace without scenario_id is its conversation's scenario: label "
            "both sides' runs with scenario_id, or replay the baseline's conversations with tracedag replay)")
    unpaired = {"baseline": sorted(b_cases - c_cases), "candidate": sorted(c_cases - b_cases)}
    return pair_by, notes, cb, cc, common, unpaired


def split_agents(base: pl.DataFrame, cand: pl.DataFrame) -> set[str]:
    """The agent names of both sides when they do not overlap (the sides are different agents), else empty."""
    b = {a for a in base["agent_name"].to_list() if a}
    c = {a for a in cand["agent_name"].to_list() if a}
    return b | c if b and c and not b & c else set()


def same_agent_key(facts: StoreFacts, agents: set[str]) -> StoreFacts:
    """``facts`` with the agent steps (and root causes) named after one of ``agents`` (``NAME`` or
    ``invoke_agent NAME``) renamed ``AGENT_KEY``."""
    names = list(agents)

    def rename(name: str, kind: str) -> pl.Expr:  # the agent's name, or a span name such as "invoke_agent NAME"
        own = (pl.col(kind) == "agent") & pl.col(name).str.split(" ").list.last().is_in(names)
        return pl.when(own).then(pl.lit(AGENT_KEY)).otherwise(pl.col(name)).alias(name)

    return StoreFacts(facts.traces.with_columns(rename("root_cause_step", "root_cause_type")),
                      facts.steps.with_columns(rename("step_name", "step_type")), facts.failures)


def _some(cases: set[str]) -> str:
    shown = sorted(cases)[:3]
    return ", ".join(shown) + (f" (+{len(cases) - 3} more)" if len(cases) > 3 else "")


def run_regress(
    data: Path, baseline: str, candidate: str, config: RegressConfig, strict: bool = False,
    progress: Callable[[str], None] = lambda phase: None,
) -> RegressResult:
    """Compare the candidate selection against the baseline over the store at ``data``."""
    progress("selecting runs")
    base, cand = _sides(data, baseline, candidate)
    pair_by, notes, cb, cc, common, unpaired = _pairing(base, cand, config)
    progress("reading scores, failures, latency, tokens, cost")
    con = selection_connection(data, [*base["trace_id"], *cand["trace_id"]])
    try:
        facts = load_facts(con, config.fail_threshold, config.pass_threshold,
                           (config.default_input_per_mtok, config.default_output_per_mtok))
        runs = det.load_all_runs(con)
    finally:
        con.close()
    agents = split_agents(base, cand)
    if agents:
        facts = same_agent_key(facts, agents)
        notes.append(f"the sides are different agents ({', '.join(sorted(agents))}): each side's agent step is "
                     f"compared as agent={AGENT_KEY}")
    keep = pl.col("case").is_in(common)
    vb, vc = case_values(facts, cb.filter(keep)), case_values(facts, cc.filter(keep))
    progress("bootstrapping case metrics")
    results = compare(vb, vc, common, config, config.seed)
    progress("determinism per scenario")
    db = det.scenario_values(runs, set(base["trace_id"]))
    dc = det.scenario_values(runs, set(cand["trace_id"]))
    scenarios = sorted(set(db["case"]) & set(dc["case"]))
    if scenarios:
        results += compare(db, dc, scenarios, config, config.seed + 1)
    else:
        notes.append("determinism not compared: no scenario has exact replays on both sides")
    decide_all(results, config)
    results.sort(key=lambda r: (_FAMILY_ORDER[r.family], r.metric))
    return RegressResult(
        baseline=Side(baseline, base.height, cb["case"].n_unique()),
        candidate=Side(candidate, cand.height, cc["case"].n_unique()),
        pair_by=pair_by, paired_cases=len(common), paired_scenarios=len(scenarios), unpaired=unpaired,
        metrics=results, resamples=config.resamples, confidence=config.confidence, seed=config.seed,
        strict=strict, notes=notes, correction=config.correction,
    )


def matrix(values: pl.DataFrame, metrics: list[str], units: list[str]) -> npt.NDArray[np.float64]:
    """``(metrics x units)`` values, NaN where missing; counting families 0 where missing."""
    out = np.full((len(metrics), len(units)), np.nan)
    m_index = {m: i for i, m in enumerate(metrics)}
    u_index = {u: j for j, u in enumerate(units)}
    for case, metric, value in values.iter_rows():
        if metric in m_index and case in u_index and value is not None:
            out[m_index[metric], u_index[case]] = value
    for metric, i in m_index.items():
        if family_of(metric) in COUNTING:
            out[i] = np.nan_to_num(out[i], nan=0.0)
    return out


def compare(base: pl.DataFrame, cand: pl.DataFrame, units: list[str], config: RegressConfig,
            seed: int) -> list[MetricResult]:
    """One ``MetricResult`` per metric of either side (disabled ones left out)."""
    metrics = sorted(m for m in set(base["metric"]) | set(cand["metric"]) if config.thresholds(m).enabled)
    b, c = matrix(base, metrics, units), matrix(cand, metrics, units)
    _check_whole_run(metrics, b, c)
    measured = [i for i in range(len(metrics)) if not (np.isnan(b[i]).all() and np.isnan(c[i]).all())]
    metrics, b, c = [metrics[i] for i in measured], b[measured], c[measured]
    interval = paired_bootstrap(c - b, config.resamples, config.confidence, seed)
    results = []
    for i, metric in enumerate(metrics):
        both = ~np.isnan(b[i]) & ~np.isnan(c[i])
        results.append(_result(metric, b[i], c[i], both, interval, i, config))
    return results


def _check_whole_run(metrics: list[str], b: npt.NDArray[np.float64], c: npt.NDArray[np.float64]) -> None:
    missing = []
    for i, metric in enumerate(metrics):
        if FAMILIES[family_of(metric)].whole_run:
            for side, values in (("baseline", b[i]), ("candidate", c[i])):
                if np.isnan(values).all():
                    missing.append(f"{metric} on the {side}")
    if missing:
        raise RegressError(f"metric absent: {', '.join(missing)} (are the steps scored? `tracedag score`)")


def _result(metric: str, b: npt.NDArray[np.float64], c: npt.NDArray[np.float64], both: npt.NDArray[np.float64],
            interval: object, i: int, config: RegressConfig) -> MetricResult:
    t = config.thresholds(metric)
    family = family_of(metric)
    pairs = int(both.sum())
    b_mean = float(np.mean(b[both])) if pairs else _mean_or_none(b)
    c_mean = float(np.mean(c[both])) if pairs else _mean_or_none(c)
    base_level = abs(b_mean) if b_mean is not None else 0.0
    result = MetricResult(metric, family, t.direction, pairs, b_mean, c_mean, None, None, None,
                          t.level("warn", base_level), t.level("fail", base_level), "ok")
    if pairs == 0:
        result.status = "absent" if config.absent == "warn" else "ok"
        result.note = "only in the candidate" if np.isnan(b).all() else "only in the baseline" \
            if np.isnan(c).all() else "never on both sides of a case"
        return result
    delta, low, high, p = (float(getattr(interval, k)[i]) for k in ("delta", "low", "high", "p"))
    result.delta, result.ci_low, result.ci_high, result.p_value = delta, low, high, p
    if pairs < config.min_pairs:
        result.status = "insufficient"
        result.note = f"{pairs} paired unit(s), fewer than min_pairs {config.min_pairs}"
    return result


def decide_all(results: list[MetricResult], config: RegressConfig) -> None:
    """Adjust the p-values over every compared metric (``config.correction``), then apply the dual
    threshold to each: effect beyond its level and adjusted p below ``1 - confidence``."""
    tested = [r for r in results if r.p_value is not None and r.status == "ok"]
    adjusted = adjust(np.array([r.p_value for r in tested], dtype=np.float64), config.correction)
    alpha = 1.0 - config.confidence
    for r, p in zip(tested, adjusted, strict=True):
        r.p_adjusted = float(p)
        t = config.thresholds(r.metric)
        assert r.delta is not None
        r.status = decide(r.delta, bool(p < alpha), abs(r.baseline_mean or 0.0), t)


def _mean_or_none(values: npt.NDArray[np.float64]) -> float | None:
    return None if np.isnan(values).all() else float(np.nanmean(values))
