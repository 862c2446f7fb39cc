"""Benchmark: cost of ``tracedag.instrument`` per step, and the wall time of ``tracedag demo`` by stage.

1. Instrumentation overhead, medians of ``--runs`` runs, microseconds per step, same exporter
   (an in-memory one behind the SDK's BatchSpanProcessor, so no network) in the same run:
   - baseline: a plain ``tracer.start_as_current_span`` with the same GenAI attributes set by hand;
   - tracedag: ``with td.tool(...) as step: step.set_result(...)`` inside ``td.run_labels``
     (labels stamped by the span processor, JSON arguments and result);
   - decorator: a ``@td.tool`` function (signature binding, JSON of the arguments and result).
2. ``tracedag demo`` (seed 7, the default settings) wall time per stage, medians of ``--demo-runs``.

    python bench/instrument.py --steps 20000 --runs 5 --demo-runs 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tracedag import instrument as td

ARGS = {"date": "saturday", "time_of_day": "18:00"}
RESULT = [{"slot_id": "court2-saturday-18:00", "court": 2}]


def _baseline(n: int) -> None:
    tracer = td.tracer()
    for i in range(n):
        with tracer.start_as_current_span("execute_tool calendar_search") as span:
            span.set_attribute("gen_ai.operation.name", "execute_tool")
            span.set_attribute("gen_ai.tool.name", "calendar_search")
            span.set_attribute("gen_ai.tool.call.id", f"call_{i}")
            span.set_attribute("gen_ai.tool.call.arguments", json.dumps(ARGS))
            span.set_attribute("gen_ai.tool.call.result", json.dumps(RESULT))
            span.set_attribute("tracedag.scenario_id", "s1")
            span.set_attribute("tracedag.replay_index", 0)


def _helper(n: int) -> None:
    with td.run_labels(scenario_id="s1", replay_index=0):
        for i in range(n):
            with td.tool("calendar_search", call_id=f"call_{i}", arguments=ARGS) as step:
                step.set_result(RESULT)


@td.tool("calendar_search")
def _search(date: str, time_of_day: str) -> list[dict[str, Any]]:
    return RESULT


def _decorator(n: int) -> None:
    with td.run_labels(scenario_id="s1", replay_index=0):
        for _ in range(n):
            _search("saturday", "18:00")


def _median_us(fn: Callable[[int], None], n: int, runs: int) -> float:
    times = []
    for _ in range(runs):
        exporter = InMemorySpanExporter()
        td.configure(service_name="bench", exporter=exporter, set_global=False, schedule_delay_millis=50)
        t0 = time.perf_counter()
        fn(n)
        td.force_flush()
        times.append((time.perf_counter() - t0) / n * 1e6)
        td.shutdown()
    return statistics.median(times)


def bench_instrument(steps: int, runs: int) -> Table:
    """Microseconds per step for the baseline, the context manager and the decorator."""
    base = _median_us(_baseline, steps, runs)
    table = Table(title=f"instrumentation, {steps} steps, median of {runs} runs")
    for col in ("variant", "µs per step", "ratio to baseline"):
        table.add_column(col, justify="left" if col == "variant" else "right")
    table.add_row("baseline: plain OTel span + attributes", f"{base:.1f}", "1.00")
    for name, fn in (("td.tool context manager", _helper), ("@td.tool decorator", _decorator)):
        value = _median_us(fn, steps, runs)
        table.add_row(name, f"{value:.1f}", f"{value / base:.2f}")
    return table


def bench_demo(runs: int) -> Table:
    """Wall time of each demo stage (seconds), median of ``runs`` demo runs."""
    from tracedag.pipeline.demo.config import DemoConfig
    from tracedag.pipeline.demo.run import run_demo

    per_stage: dict[str, list[float]] = {}
    totals = []
    for _ in range(runs):
        timer = _StageTimer()
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            result = run_demo(DemoConfig(data=Path(tmp) / "demo"), timer)
            totals.append(time.perf_counter() - t0)
        assert all(s == "ok" for s in result.stages.values()), result.stages
        for stage, seconds in timer.durations().items():
            per_stage.setdefault(stage, []).append(seconds)
    table = Table(title=f"tracedag demo, median of {runs} runs")
    table.add_column("stage")
    table.add_column("seconds", justify="right")
    for stage, values in per_stage.items():
        table.add_row(stage, f"{statistics.median(values):.2f}")
    table.add_row("total", f"{statistics.median(totals):.2f}")
    return table


class _StageTimer:
    """A progress sink that notes when each stage starts (the next stage's start ends it)."""

    def __init__(self) -> None:
        self.starts: list[tuple[str, float]] = []
        self.end = time.perf_counter()

    def add_task(self, description: str, total: float | None = None) -> str:
        self.starts.append((description, time.perf_counter()))
        return description

    def update(self, task_id: Any, **kw: Any) -> None:
        self.end = time.perf_counter()

    def durations(self) -> dict[str, float]:
        marks = [t for _, t in self.starts[1:]] + [self.end]
        return {name: end - start for (name, start), end in zip(self.starts, marks, strict=True)}


def main() -> None:
    """Run both benchmarks and print their tables."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--demo-runs", type=int, default=3)
    args = parser.parse_args()
    console = Console()
    console.print(bench_instrument(args.steps, args.runs))
    if args.demo_runs > 0:
        console.print(bench_demo(args.demo_runs))


if __name__ == "__main__":
    main()
