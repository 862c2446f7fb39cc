"""The demo's counterfactual check: the first failed conversations' root causes confirmed or refuted
by re-running them with the root step replaced (``tracedag confirm`` on the example agent)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path

DEMO_CONFIRM_DIR = "confirm"
"""Where the demo stores its counterfactual runs: a store of its own under the demo's data directory,
so the demo's own figures stay those of the simulation; the verdicts go into the demo store."""


def demo_confirm(data: Path, conversations: int = 2, times: int = 2) -> dict[str, int]:
    """Check the greedy root causes of the first ``conversations`` failed conversations of the demo store
    (runs into ``<data>/confirm/``, verdicts into ``root_cause_checks``); the figures of the demo line."""
    from tracedag.pipeline.demo.replay_example import example_target
    from tracedag.pipeline.replay.confirm import plan_checks, select_checks
    from tracedag.pipeline.replay.confirm_run import judge, run_checks, write_checks
    from tracedag.pipeline.replay.confirm_scores import score_runs
    from tracedag.pipeline.replay.source import Selection
    from tracedag.pipeline.service import CollectorConfig, start_collector

    sources, causes = select_checks(data, Selection(failed_only=True), "greedy")
    checks = plan_checks(data, sources[:conversations], causes)
    runs = data / DEMO_CONFIRM_DIR
    collector = start_collector(CollectorConfig(data=runs, http_port=0, grpc_port=None))
    try:
        result = run_checks(checks, example_target({"latency_scale": "0"}), f"http://127.0.0.1:{collector.http_port}",
                            times, "demo-confirm", set_global=False)
        collector.flush()
    finally:
        collector.stop()
    if result is not None:
        score_runs(runs)
    rows = judge(data, checks, result, "example", "demo-confirm", runs_data=runs)
    write_checks(data, rows)
    verdicts = [str(r["verdict"]) for r in rows]
    return {"confirm_checked": len(rows), "confirm_times": times, "confirm_confirmed": verdicts.count("confirmed"),
            "confirm_refuted": verdicts.count("refuted"), "confirm_inconclusive": verdicts.count("inconclusive")}


def confirm_line(data: Path, counts: Mapping[str, int]) -> str:
    """One line: the demo's counterfactual checks and the command to try next."""
    where = shlex.quote(str(data))
    return (f"confirm: {counts['confirm_checked']} root causes re-run {counts['confirm_times']}x with only the root "
            f"step's output replaced: {counts['confirm_confirmed']} confirmed, {counts['confirm_refuted']} refuted, "
            f"{counts['confirm_inconclusive']} inconclusive (the confirmed column of root_causes); try: tracedag "
            f"confirm --data {where} --agent example --failed --times 3")
