"""Rich tables of an analysis: determinism per scenario and per agent, node utilization, graph figures."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from tracedag.pipeline.analysis.determinism import AnalysisResult
from tracedag.pipeline.analysis.pairs import CONFIDENCE, PAIR_SAMPLE, bound
from tracedag.pipeline.analysis.response import OFFLINE_SAMPLED_METHOD
from tracedag.pipeline.analysis.trajectories import UNLABELLED

logger = logging.getLogger(__name__)

_METRICS = [
    ("node_consistency", "node cons."), ("node_coverage", "node cov."),
    ("action_consistency", "action cons."), ("action_coverage", "action cov."),
    ("action_input_consistency", "act+input cons."), ("action_input_coverage", "act+input cov."),
]


def _f(value: Any, digits: int = 2) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _pct(value: Any) -> str:
    return "—" if value is None else f"{100 * value:.0f}%"


def _agent(row: dict[str, Any]) -> str:
    return str(row["agent"]) + (f" {row['agent_version']}" if row.get("agent_version") else "")


def _metric(row: dict[str, Any], key: str) -> str:
    """A metric cell; ``≈`` in front of a coverage estimated from sampled pairs."""
    estimated = key.endswith("_coverage") and key.removesuffix("_coverage") in (row.get("coverage_estimated") or ())
    return ("≈" if estimated and row[key] is not None else "") + _f(row[key])


def _response(row: dict[str, Any]) -> str:
    value = row.get("response_consistency")
    if value is None:
        return "—"
    method = row.get("response_consistency_method") or ""
    mark = "≈" if OFFLINE_SAMPLED_METHOD in method else ""
    return f"{mark}{value:.2f} ({'offline' if 'offline' in method else method})"


def estimate_note() -> str:
    """What ``≈`` means: the sample and its error bound (``pairs``)."""
    eps = bound(CONFIDENCE, PAIR_SAMPLE)
    return (f"≈ estimated: more than {PAIR_SAMPLE:,} pairs of distinct sets, so the mean Jaccard is taken over "
            f"{PAIR_SAMPLE:,} seeded random pairs (the same on every run): within ±{eps:.4f} of the exact mean "
            f"(±{3 * eps:.3f} on the 1–4 response scale) with {CONFIDENCE:.1%} confidence.")


def _estimated(rows: list[dict[str, Any]]) -> bool:
    return any(r.get("coverage_estimated") or OFFLINE_SAMPLED_METHOD in (r.get("response_consistency_method") or "")
               for r in rows)


def group_by_hint(result: AnalysisResult, group_by: str | None) -> str | None:
    """One line suggesting ``--group-by`` when runs carry no scenario label (they form one scenario)."""
    if group_by is not None:
        return None
    unlabelled = sum(r.scenario == UNLABELLED for r in result.runs)
    if not unlabelled:
        return None
    return (f"{unlabelled:,} of {len(result.runs):,} runs have no scenario label (tracedag.scenario_id), so they "
            f"count as one scenario {UNLABELLED}: group them with --group-by, e.g. "
            f"tracedag determinism --group-by \"attributes['app.intent']\"")


def determinism_table(rows: list[dict[str, Any]], title: str, per_scenario: bool) -> Table:
    """Determinism rows as a rich table (per agent and scenario, or per agent)."""
    t = Table(title=title, title_justify="left")
    t.add_column("agent")
    if per_scenario:
        t.add_column("scenario")
    t.add_column("vs")
    t.add_column("runs", justify="right")
    for _, label in _METRICS:
        t.add_column(label, justify="right")
    t.add_column("response 1–4", justify="right")
    for r in rows:
        cells = [_agent(r)] + ([r["scenario"]] if per_scenario else []) + [r["comparison"], _f(r["runs"])]
        cells += [_metric(r, k) for k, _ in _METRICS] + [_response(r)]
        if per_scenario and r.get("reason"):
            cells[-1] = r["reason"]
        t.add_row(*cells)
    return t


def node_table(rows: list[dict[str, Any]]) -> Table:
    """Node utilization per agent."""
    t = Table(title="node utilization per agent", title_justify="left")
    for name, justify in (("agent", "left"), ("node", "left"), ("conversations", "right"),
                          ("share", "right"), ("visits", "right"), ("visits/conv.", "right"),
                          ("failures", "right")):
        t.add_column(name, justify=justify)  # type: ignore[arg-type]
    for r in rows:
        t.add_row(_agent(r), r["node"], str(r["conversations"]), _pct(r["conversation_share"]),
                  str(r["visits"]), _f(r["visits_per_conversation"]), str(r["failures"]))
    return t


def agent_table(rows: list[dict[str, Any]]) -> Table:
    """Graph-level figures per agent."""
    t = Table(title="agent graph per agent", title_justify="left")
    cols = ["agent", "conv.", "turns", "transitions/turn", "failed visits", "adherence",
            "convergence", "completion"]
    for c in cols:
        t.add_column(c, justify="left" if c == "agent" else "right")
    for r in rows:
        t.add_row(_agent(r), str(r["conversations"]), str(r["turns"]), _f(r["transitions_per_turn"]),
                  str(r["failed_visits"]), _pct(r["adherence"]), _pct(r["convergence_rate"]),
                  _pct(r["completion_rate"]))
    return t


def print_report(console: Console, result: AnalysisResult, written: dict[str, Path]) -> None:
    """Print every table and where the outputs went."""
    if not result.runs:
        console.print("[yellow]no runs found in the store[/yellow]")
    tables = {k: v.to_pylist() for k, v in result.tables.items()}
    console.print(determinism_table(tables["determinism"], "determinism per agent and scenario", True))
    console.print(determinism_table(tables["determinism_agent"], "determinism per agent", False))
    console.print(node_table(tables["node_utility"]))
    console.print(agent_table(tables["agent_utility"]))
    methods = {r["response_consistency_method"] for r in tables["determinism"]} - {None}
    if any("offline" in m for m in methods):
        console.print("response consistency: offline token-Jaccard measure (1 + 3·J), not a judge score; "
                      "set --judge-model for a judge.")
    if _estimated(tables["determinism"]):
        console.print(estimate_note())
    for name, path in written.items():
        console.print(f"{name}: {path}")
