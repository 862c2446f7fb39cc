"""Benchmark: the cost per span of normalization (``tracedag.pipeline.normalize.spans.normalize``).

Inputs, ``--spans`` rows each:
- ``captured``: spans captured from the real libraries (tests/realspans.py: LangGraph +
  OpenInference, LangGraph + OpenLLMetry, openai-v2, plain GenAI) repeated: every span is an
  agent span with JSON payloads, and payloads repeat as in replays;
- ``generated``: the agent traces of bench/gen.py (GenAI attributes, message JSON on every LLM,
  tool and agent span), every payload different;
- ``plain``: generic HTTP-like server spans (no GenAI attributes).
Normalizers, measured in the same run: the interim normalizer that only appended null agent
columns (baseline), ``normalize(reference=True)`` (JSON reduced per row with the standard
``json`` module: the oracle of the fast paths) and ``normalize``. Prints medians of ``--runs``
wall and CPU (process) times, and the load average (the machine may be shared).

    python bench/normalize.py --spans 50000 --runs 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from tracedag.pipeline.normalize.spans import normalize  # noqa: E402
from tracedag.schemas.spans import AGENT_FIELDS, BASE_SCHEMA, SPANS_V1  # noqa: E402


def interim_normalize(base: pa.Table) -> pa.Table:
    """The baseline: agent columns as nulls (the interim version this issue replaced)."""
    n = base.num_rows
    for f in AGENT_FIELDS:
        base = base.append_column(f, pa.nulls(n, f.type))
    return base.cast(SPANS_V1)


def agent_base(n: int) -> pa.Table:
    """``n`` BASE_SCHEMA rows cycling through the spans captured from the real libraries."""
    import realspans

    spans = (
        realspans.langgraph_spans().spans
        + realspans.langgraph_spans(dialect="openllmetry").spans
        + realspans.openai_spans(True)
        + realspans.genai_plain_spans()
    )
    one = realspans.to_table(spans).select(BASE_SCHEMA.names).cast(BASE_SCHEMA)
    return _repeat(one, n)


def plain_base(n: int) -> pa.Table:
    """``n`` BASE_SCHEMA rows of generic server spans (a handful of HTTP attributes, no GenAI)."""
    import realspans

    def emit(tracer: object) -> None:
        for i in range(64):
            attrs = {"http.method": "GET", "http.route": "/users/{id}", "http.status_code": 200,
                     "net.peer.name": f"10.0.0.{i}", "user_agent.original": "curl/8"}
            with tracer.start_as_current_span(f"GET /users/{i}", attributes=attrs):  # type: ignore[attr-defined]
                pass

    with realspans.capture("http-service") as (provider, exporter):
        emit(provider.get_tracer("bench"))
        spans = list(exporter.get_finished_spans())
    return _repeat(realspans.to_table(spans).select(BASE_SCHEMA.names).cast(BASE_SCHEMA), n)


def generated_base(n: int) -> pa.Table:
    """``n`` BASE_SCHEMA rows of bench/gen.py agent traces (columnar converter, no normalization)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from bench.gen import requests
    from tracedag.pipeline.convert.columnar import ColumnBuilder

    builder = ColumnBuilder()
    for req in requests(n):
        builder.add(ExportTraceServiceRequest.FromString(req.SerializeToString()), 1)
    base, _, _ = builder.finish("bench")
    return base.slice(0, n).cast(BASE_SCHEMA)


def _repeat(one: pa.Table, n: int) -> pa.Table:
    reps = -(-n // one.num_rows)
    return pa.concat_tables([one] * reps).slice(0, n).combine_chunks()


def timed(fn: Callable[[pa.Table], pa.Table], base: pa.Table, runs: int) -> tuple[float, float]:
    """Median (wall, CPU) seconds of ``fn(base)`` over ``runs`` runs, after one warm-up run."""
    fn(base)
    wall, cpu = [], []
    for _ in range(runs):
        t0, c0 = time.perf_counter(), time.process_time()
        fn(base)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall), statistics.median(cpu)


def _reference(base: pa.Table) -> pa.Table:
    return normalize(base, reference=True)


NORMALIZERS: list[tuple[str, Callable[[pa.Table], pa.Table]]] = [
    ("interim (nulls)", interim_normalize),
    ("reference (per row)", _reference),
    ("normalize", normalize),
]


def main() -> None:
    """Measure and print the table of medians."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--spans", type=int, default=50_000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    load_before = os.getloadavg()
    table = Table(title=f"normalize, {args.spans} spans, median of {args.runs} runs")
    for col in ("input", "normalizer", "wall ms", "wall µs/span", "CPU µs/span", "spans/s (wall)",
                "added CPU µs/span"):
        table.add_column(col, justify="left" if col in ("input", "normalizer") else "right")
    inputs = (("captured", agent_base), ("generated", generated_base), ("plain", plain_base))
    for label, make in inputs:
        base = make(args.spans)
        n = base.num_rows
        results = [(name, timed(fn, base, args.runs)) for name, fn in NORMALIZERS]
        base_cpu = results[0][1][1]
        for name, (wall, cpu) in results:
            added = "-" if name.startswith("interim") else f"{(cpu - base_cpu) / n * 1e6:.2f}"
            table.add_row(label, name, f"{wall * 1e3:.1f}", f"{wall / n * 1e6:.2f}", f"{cpu / n * 1e6:.2f}",
                          f"{n / wall:,.0f}", added)
    console = Console(width=150)
    console.print(table)
    console.print(f"load average (1 min) before: {load_before[0]:.2f}, after: {os.getloadavg()[0]:.2f} "
                  f"on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
