"""Evidence for the regression gate (docs/pages/regress.md): precision/recall over six simulated
updates of the bundled agent, and the cases step-level vs end-to-end comparison needs for 80% power.

Store: one collector, the bundled court-booking agent simulated over OTLP (both agent variants,
every DFS path, exact replays and two rephrased variants each), built and scored by the pipeline.

1. Precision/recall. ``--reps`` repetitions; in each, a baseline (seed 1000+k, service_version
   ``base-k``) and six candidates (seed 2000+k, service_version ``<update>-k``), each one update:
   four harmful (a calendar tool failing more often, a prompt change that drops the required
   ``time_of_day`` argument, a 4x slower calendar, a router that skips the calendar search) and two
   harmless (reworded replies of the same length, a 2x faster calendar). The gate (``run_regress``,
   default config: cases paired by scenario and replay index) flags a candidate when it exits 1.
   Precision = flagged harmful / flagged; recall = flagged harmful / harmful.
2. Power. A pool of ``--pool-replays`` replays per scenario: a baseline and a subtly regressed
   candidate per injected update. A case is one conversation (pair_by scenario, replay index,
   variant, agent). For n cases, ``--subsets`` random subsets of n paired cases (drawn with
   replacement from the pool) are tested; power(n) = share of subsets in which a detector fires
   (``_alerts``: the gate's fail level; significance only; one targeted metric). End-to-end =
   workflow_score, pass_rate; step-level = step_score, failure_rate, root_cause, step_visits of
   every step type and name (p-values adjusted within each set). The "null" pool (no change)
   gives each detector's false-alarm rate. Reports the smallest n with power >= 80%, and ratios.
3. Speed: the median of ``--runs`` ``run_regress`` calls beside the median of the ``trace_summary``
   named query over the same store (the baseline it reads).

    python bench/regress.py --reps 4 --replays 4 --pool-replays 30
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from tracedag.pipeline.demo import simulate as sim
from tracedag.pipeline.demo import stages
from tracedag.pipeline.demo.agent.tweaks import Tweaks
from tracedag.pipeline.regress import FAMILIES, RegressConfig, RegressError, run_regress
from tracedag.pipeline.regress.facts import case_values, load_facts, selection_connection
from tracedag.pipeline.regress.gate import case_keys, matrix
from tracedag.pipeline.regress.selection import parse_selection, select_traces
from tracedag.pipeline.regress.stats import adjust, decide, paired_bootstrap
from tracedag.pipeline.store.querying import run_named

UPDATES: dict[str, tuple[bool, dict[str, Any]]] = {
    "tool_fails_more": (True, {"fault_rate": 0.45}),
    "drops_required_arg": (True, {"tweaks": Tweaks(drop_time_rate=0.3)}),
    "slower_tool": (True, {"tweaks": Tweaks(calendar_latency=4.0)}),
    "router_skips_step": (True, {"tweaks": Tweaks(skip_availability_rate=0.3)}),
    "rephrased_replies": (False, {"tweaks": Tweaks(rephrase=True)}),
    "faster_tool": (False, {"tweaks": Tweaks(calendar_latency=0.5)}),
}
POWER_UPDATES: dict[str, dict[str, Any]] = {
    "null": {},  # no change: the false-alarm rate of each detector
    "tool_fails_more": {"fault_rate": 0.40},
    "drops_required_arg": {"tweaks": Tweaks(drop_time_rate=0.15)},
}
TARGET = "step_score[tool=calendar_search]"
"""The step-level metric of the affected step (both injected updates hit the calendar search)."""
DETECTORS = ("e2e_gate", "step_gate", "e2e_sig", "step_sig", "e2e_one", "step_one")
E2E = ("workflow_score", "pass_rate")
STEP = ("step_score", "failure_rate", "root_cause", "step_visits")
PER_CONVERSATION = ("scenario_id", "replay_index", "variant_id", "agent_name")


def simulate_all(data: Path, plan: list[tuple[str, int, int, dict[str, Any]]], console: Console) -> None:
    """Run every planned simulation into one collector, then build and score the store."""
    paths = stages.conversation_paths(2)
    collector = stages.start(data)
    try:
        endpoint = f"http://127.0.0.1:{collector.http_port}"
        with Progress(console=console) as progress:
            task = progress.add_task("simulate", total=len(plan))
            for version, seed, replays, kw in plan:
                config = sim.SimulationConfig(endpoint=endpoint, seed=seed, replays=replays, variants=2,
                                              service_version=version, simulation_id=f"bench-{version}", **kw)
                sim.simulate(config, paths)
                progress.advance(task)
        collector.flush()
    finally:
        collector.stop()
    t0 = time.perf_counter()
    stages.build(data)
    stages.score(data)
    console.print(f"built and scored in {time.perf_counter() - t0:.1f} s")


def precision_recall(data: Path, reps: int, console: Console) -> dict[str, Any]:
    """Run the gate on every (update, repetition); count flagged candidates."""
    config = RegressConfig(resamples=2000)
    rows = []
    for name, (harmful, _) in UPDATES.items():
        flagged = []
        for k in range(reps):
            result = run_regress(data, f"service_version=base-{k}", f"service_version={name}-{k}", config)
            flagged.append(result.exit_code == 1)
            fails = [m.metric for m in result.alerts("fail")]
            console.print(f"  {name} rep {k}: exit {result.exit_code}, {len(fails)} fail-level: "
                          f"{', '.join(fails[:4])}{' ...' if len(fails) > 4 else ''}", markup=False)
        rows.append({"update": name, "harmful": harmful, "flagged": sum(flagged), "runs": reps})
    tp = sum(r["flagged"] for r in rows if r["harmful"])
    fp = sum(r["flagged"] for r in rows if not r["harmful"])
    positives = sum(r["runs"] for r in rows if r["harmful"])
    precision = tp / (tp + fp) if tp + fp else float("nan")
    return {"rows": rows, "tp": tp, "fp": fp, "fn": positives - tp, "precision": precision,
            "recall": tp / positives}


def _pool(data: Path, base: str, cand: str, config: RegressConfig) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Per-case matrices (metrics x cases) of both sides over their common cases."""
    sides = []
    for sel in (base, cand):
        labels = pl.from_arrow(select_traces(data, parse_selection(sel, "bench"), "bench"))
        assert isinstance(labels, pl.DataFrame)
        sides.append(case_keys(labels, list(config.pair_by)))
    con = selection_connection(data, [*sides[0]["trace_id"], *sides[1]["trace_id"]])
    try:
        facts = load_facts(con, config.fail_threshold, config.pass_threshold)
    finally:
        con.close()
    common = sorted(set(sides[0]["case"]) & set(sides[1]["case"]))
    values = [case_values(facts, s.filter(pl.col("case").is_in(common))) for s in sides]
    metrics = sorted(m for m in set(values[0]["metric"]) | set(values[1]["metric"])
                     if m.split("[")[0] in E2E + STEP)
    return metrics, matrix(values[0], metrics, common), matrix(values[1], metrics, common)


def _alerts(metrics: list[str], b: np.ndarray, c: np.ndarray, config: RegressConfig, seed: int) -> dict[str, bool]:
    """Does each detector fire on this subset? ``*_gate``: any metric of the set alerts at fail level
    (the gate's dual threshold, p-values adjusted over the set); ``*_sig``: any metric of the set is
    significant on the worse side (adjusted, no effect threshold); ``*_one``: the single metric
    ``pass_rate`` (end to end) / ``TARGET`` (step level) is significant on the worse side."""
    iv = paired_bootstrap(c - b, 500, config.confidence, seed)
    alpha = 1.0 - config.confidence
    out = dict.fromkeys(DETECTORS, False)
    for kind, families in (("e2e", E2E), ("step", STEP)):
        idx = [i for i, m in enumerate(metrics) if m.split("[")[0] in families
               and iv.pairs[i] >= config.min_pairs and not np.isnan(iv.p[i])]
        adjusted = adjust(iv.p[idx], config.correction)
        for i, p in zip(idx, adjusted, strict=True):
            t = config.thresholds(metrics[i])
            base_mean = float(np.nanmean(b[i])) if not np.isnan(b[i]).all() else 0.0
            delta = float(iv.delta[i])
            out[f"{kind}_gate"] |= decide(delta, bool(p < alpha), abs(base_mean), t) == "fail"
            zero = dataclasses.replace(t, warn=1e-12, fail=1e-12, warn_rel=0.0, fail_rel=0.0)
            out[f"{kind}_sig"] |= decide(delta, bool(p < alpha), 0.0, zero) == "fail"
            if metrics[i] in ("pass_rate", TARGET):
                out[f"{kind}_one"] = decide(delta, bool(iv.p[i] < alpha), 0.0, zero) == "fail"
    return out


def power_curve(data: Path, name: str, grid: list[int], subsets: int, console: Console) -> dict[str, Any]:
    """Power per n for the four detectors, and the smallest n reaching 80% for each."""
    config = RegressConfig(pair_by=PER_CONVERSATION)
    metrics, b, c = _pool(data, "service_version=pool-base", f"service_version=pool-{name}", config)
    rng = np.random.default_rng(7)
    curve = []
    for n in grid:
        hits = dict.fromkeys(DETECTORS, 0)
        for s in range(subsets):
            pick = rng.integers(0, b.shape[1], size=n)
            for key, hit in _alerts(metrics, b[:, pick], c[:, pick], config, seed=s).items():
                hits[key] += int(hit)
        curve.append({"n": n, **{k: v / subsets for k, v in hits.items()}})
        console.print(f"  {name} n={n}: " + ", ".join(f"{k} {v / subsets:.2f}" for k, v in hits.items()))
    needed = {k: next((p["n"] for p in curve if p[k] >= 0.8), None) for k in DETECTORS}
    return {"pool_cases": int(b.shape[1]), "curve": curve, "needed": needed,
            "n80": {k: n_at(curve, k) for k in DETECTORS}}


def n_at(curve: list[dict[str, Any]], key: str, power: float = 0.8) -> float | None:
    """Cases for ``power``, interpolated linearly in log n between the two grid points around it."""
    for lo, hi in zip(curve, curve[1:], strict=False):
        if lo[key] < power <= hi[key]:
            share = (power - lo[key]) / (hi[key] - lo[key])
            return float(lo["n"] * (hi["n"] / lo["n"]) ** share)
    return float(curve[0]["n"]) if curve and curve[0][key] >= power else None


def speed(data: Path, runs: int) -> dict[str, float]:
    """Median seconds of run_regress and of the trace_summary query it reads (the baseline)."""
    config = RegressConfig()
    gate, query = [], []
    for _ in range(runs):
        t0 = time.perf_counter()
        run_named(data, "trace_summary")
        query.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        run_regress(data, "service_version=base-0", "service_version=tool_fails_more-0", config)
        gate.append(time.perf_counter() - t0)
    return {"regress_s": statistics.median(gate), "trace_summary_s": statistics.median(query)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--replays", type=int, default=4)
    parser.add_argument("--pool-replays", type=int, default=30)
    parser.add_argument("--subsets", type=int, default=200)
    parser.add_argument("--grid", default="10,20,40,80,160,320,640")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed-offset", type=int, default=0, help="Added to every simulation seed (a fresh sample).")
    parser.add_argument("--data", type=Path, default=None, help="Keep the store here (made once, reused after).")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out" / "regress.json")
    args = parser.parse_args()
    console = Console()
    data = args.data or Path(tempfile.mkdtemp(prefix="tracedag-bench-regress-")) / "data"
    if not (data / "tables" / "traces").exists():
        # interleaved, so the machine's load drifts alike over a baseline and its candidates
        o = args.seed_offset
        plan = [run for k in range(args.reps) for run in
                [(f"base-{k}", o + 1000 + k, args.replays, {})]
                + [(f"{name}-{k}", o + 2000 + 10 * i + k, args.replays, kw)
                   for i, (name, (_, kw)) in enumerate(UPDATES.items())]]
        plan += [("pool-base", o + 3000, args.pool_replays, {})]
        plan += [(f"pool-{name}", o + 4000 + i, args.pool_replays, kw)
                 for i, (name, kw) in enumerate(POWER_UPDATES.items())]
        data.mkdir(parents=True, exist_ok=True)
        simulate_all(data, plan, console)
    console.print("[bold]1. precision / recall[/bold]")
    pr = precision_recall(data, args.reps, console)
    console.print("[bold]2. power[/bold]")
    grid = [int(x) for x in args.grid.split(",")]
    power = {name: power_curve(data, name, grid, args.subsets, console) for name in POWER_UPDATES}
    console.print("[bold]3. speed[/bold]")
    times = speed(data, args.runs)
    report(console, pr, power, times)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"precision_recall": pr, "power": power, "speed": times,
                                    "families": list(FAMILIES)}, indent=1) + "\n")
    console.print(f"written: {args.out} (store: {data})")


def report(console: Console, pr: dict[str, Any], power: dict[str, Any], times: dict[str, float]) -> None:
    table = Table(title="gate over six updates (baseline vs candidate, independent seeds)")
    for col in ("update", "harmful", "flagged"):
        table.add_column(col)
    for r in pr["rows"]:
        table.add_row(r["update"], "yes" if r["harmful"] else "no", f"{r['flagged']}/{r['runs']}")
    console.print(table)
    console.print(f"precision {pr['precision']:.0%}, recall {pr['recall']:.0%} (TP {pr['tp']}, FP {pr['fp']}, "
                  f"FN {pr['fn']}); AgentEval reports 88% / 94%")
    null = power.get("null")
    for name, p in power.items():
        if name == "null":
            continue
        nd = {k: round(v) if v else None for k, v in p["n80"].items()}
        for a, b, what in (("e2e_one", "step_one", f"pass_rate vs {TARGET}"), ("e2e_sig", "step_sig", "any metric"),
                           ("e2e_gate", "step_gate", "the gate (dual threshold)")):
            ratio = f" (x{nd[a] / nd[b]:.1f})" if nd[a] and nd[b] else ""
            console.print(f"{name}, {what}: cases for 80% power: end-to-end {nd[a] or '>max'}, "
                          f"step-level {nd[b] or '>max'}{ratio}", markup=False)
    if null is not None:
        worst = {k: max(p[k] for p in null["curve"]) for k in DETECTORS}
        console.print("false alarms with no change (highest over n): " + ", ".join(
            f"{k} {v:.2f}" for k, v in worst.items()) + "; AgentEval reports 4x fewer cases step-level")
    console.print(f"speed: run_regress median {times['regress_s']:.2f} s; trace_summary query (baseline) "
                  f"{times['trace_summary_s']:.2f} s")


if __name__ == "__main__":
    try:
        main()
    except RegressError as e:
        sys.exit(f"regress: {e}")
