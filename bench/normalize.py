"""Benchmark: the cost per span of normalization (``tracedag.pipeline.normalize.normalize``).

Input: spans captured from the real libraries (tests/realspans.py: LangGraph + OpenInference,
LangGraph + OpenLLMetry, openai-v2, plain GenAI), converted to ``BASE_SCHEMA`` rows and repeated
to ``--spans`` rows (a worst case: every span is an agent span with JSON payloads), plus a
``plain`` mix of generic HTTP-like spans (no GenAI attributes). Baseline, measured in the same
run: the interim normalizer that only appended null agent columns. Prints medians of ``--runs``.

    python bench/normalize.py --spans 50000 --runs 5
"""

from __future__ import annotations

import argparse
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

from tracedag.pipeline.normalize import normalize  # noqa: E402
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


def _repeat(one: pa.Table, n: int) -> pa.Table:
    reps = -(-n // one.num_rows)
    return pa.concat_tables([one] * reps).slice(0, n).combine_chunks()


def timed(fn: Callable[[pa.Table], pa.Table], base: pa.Table, runs: int) -> float:
    """Median seconds of ``fn(base)`` over ``runs`` runs."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn(base)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    """Measure and print the table of medians."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--spans", type=int, default=50_000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    table = Table(title=f"normalize, {args.spans} spans, median of {args.runs} runs")
    for col in ("input", "normalizer", "ms", "µs/span", "spans/s", "added µs/span"):
        table.add_column(col)
    for label, base in (("agent spans", agent_base(args.spans)), ("plain spans", plain_base(args.spans))):
        base_t = timed(interim_normalize, base, args.runs)
        real_t = timed(normalize, base, args.runs)
        for name, t in (("interim (nulls)", base_t), ("normalize", real_t)):
            added = f"{(t - base_t) / args.spans * 1e6:.2f}" if name == "normalize" else "-"
            table.add_row(label, name, f"{t * 1e3:.1f}", f"{t / args.spans * 1e6:.2f}", f"{args.spans / t:,.0f}", added)
    Console().print(table)


if __name__ == "__main__":
    main()
