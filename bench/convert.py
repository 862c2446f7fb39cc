"""Benchmark: OTLP -> Arrow conversion, fast columnar path vs the naive loop vs parse-only.

All figures are measured in the same run on the same generated batches (``bench/gen.py``,
512 spans and about 1.3 KB per span): medians of ``--runs`` runs, spans per second.

- parse-only: ``ExportTraceServiceRequest.FromString`` of every batch (the ceiling);
- naive: parse + ``reference.requests_to_table`` (the reference loop: rows, ``from_pydict``);
- fast: ``records.convert_records`` (spans decoded in lockstep from the wire, attributes decoded
  for the whole batch, keys and content hashes too), in 1 process and in 2 worker processes; the
  base columns alone for the lockstep decoder, the per-span wire builder and the object-based
  columnar builder;
- the whole spool -> Parquet round (``SpoolConverter.run_once``: read segments, convert,
  dedupe, sort, write zstd Parquet with fsync), 1 and 2 processes;
- conversions with and without normalization (the agent columns, ``normalize``), since that step is
  shared by both converters.

    python bench/convert.py --spans 50000 --runs 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gen import payloads
from tracedag.pipeline.convert import reference
from tracedag.pipeline.convert.columnar import ColumnBuilder, WireBuilder
from tracedag.pipeline.convert.pool import convert_parallel, shutdown
from tracedag.pipeline.convert.records import convert_records
from tracedag.pipeline.convert.wirespans import SpanBuilder
from tracedag.schemas.spans import BASE_SCHEMA

Bodies = list[bytes]


def parse_only(bodies: Bodies) -> None:
    """Parse every batch (the ceiling)."""
    for b in bodies:
        ExportTraceServiceRequest.FromString(b)


def naive(bodies: Bodies) -> None:
    """The reference loop plus normalization."""
    reference.requests_to_table((ExportTraceServiceRequest.FromString(b), 1, "bench") for b in bodies)


def naive_base(bodies: Bodies) -> None:
    """The reference loop, base columns only."""
    cols: dict[str, list[object]] = {f.name: [] for f in BASE_SCHEMA}
    for b in bodies:
        for k, v in reference.request_to_rows(ExportTraceServiceRequest.FromString(b), 1, "bench").items():
            cols[k].extend(v)
    pa.Table.from_pydict(cols, schema=BASE_SCHEMA)


def fast(bodies: Bodies, workers: int = 1) -> None:
    """The production conversion (``convert_records``)."""
    pairs = [(b, 1) for b in bodies]
    if workers > 1:
        convert_parallel(pairs, "bench", workers)
    else:
        convert_records(pairs, "bench")


def fast_base(bodies: Bodies) -> None:
    """The object-based columnar builder, base columns only."""
    builder = ColumnBuilder()
    for b in bodies:
        builder.add(ExportTraceServiceRequest.FromString(b), 1)
    builder.finish("bench")


def wire_base(bodies: Bodies) -> None:
    """The wire builder, base columns only."""
    builder = WireBuilder()
    for b in bodies:
        builder.add_payload(b, 1)
    builder.finish("bench")


def lockstep_base(bodies: Bodies) -> None:
    """The lockstep span decoder (the production path), base columns only."""
    builder = SpanBuilder()
    for b in bodies:
        builder.add_payload(b, 1)
    builder.finish("bench")


def spool_to_parquet(bodies: Bodies, workers: int) -> tuple[float, float]:  # the timed part only
    """Wall and CPU seconds (this process and its workers) for ``SpoolConverter.run_once`` to turn
    the batches (in 16 MB segments) into Parquet; writing the spool first is not counted."""
    from tracedag.collector.spool import SpoolWriter
    from tracedag.pipeline.ingest.segments import SpoolConverter

    with tempfile.TemporaryDirectory() as tmp:
        writer = SpoolWriter(Path(tmp))
        now = time.time_ns()
        for b in bodies:
            writer.append(b, now)
        writer.flush()
        writer.close()
        conv = SpoolConverter(tmp, workers=workers)
        c, t = time.process_time() + _pool_cpu(), time.perf_counter()
        conv.run_once()
        return time.perf_counter() - t, time.process_time() + _pool_cpu() - c


def _pool_cpu() -> float:
    """CPU seconds used so far by the live conversion worker processes (from /proc)."""
    from tracedag.pipeline.convert import pool as convert_pool

    pool = convert_pool._POOL
    total = 0.0
    for pid in list(getattr(pool, "_processes", {}) or {}):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def measure(fn: Callable[[Bodies], tuple[float, float] | None], bodies: Bodies, runs: int) -> tuple[float, float]:
    """Return the median wall seconds and median CPU seconds (this process + workers) of ``runs`` calls
    (of the part ``fn`` timed itself, when it returns its own (wall, CPU) seconds)."""
    fn(bodies)
    walls, cpus = [], []
    for _ in range(runs):
        c, w = time.process_time() + _pool_cpu(), time.perf_counter()
        inner = fn(bodies)
        wall, cpu = inner if inner is not None else (time.perf_counter() - w, time.process_time() + _pool_cpu() - c)
        walls.append(wall)
        cpus.append(cpu)
    return statistics.median(walls), statistics.median(cpus)


def main(argv: list[str] | None = None) -> int:
    """Measure every case on the same batches and print the table."""
    ap = argparse.ArgumentParser(description="OTLP -> Arrow conversion benchmark")
    ap.add_argument("--spans", type=int, default=50_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    console = Console(width=160)
    with console.status("generating batches"):
        bodies = payloads(args.spans, args.seed)
    n = sum(len(ss.spans) for b in bodies for rs in ExportTraceServiceRequest.FromString(b).resource_spans
            for ss in rs.scope_spans)
    size = sum(len(b) for b in bodies)
    cases: list[tuple[str, Callable[[Bodies], tuple[float, float] | None], int]] = [
        ("parse-only (ceiling)", parse_only, 1),
        ("naive loop + normalize", naive, 1),
        ("naive loop, base columns", naive_base, 1),
        ("fast, 1 process + normalize", fast, 1),
        ("fast (objects), base columns", fast_base, 1),
        ("fast (wire), base columns", wire_base, 1),
        ("fast (lockstep spans), base columns", lockstep_base, 1),
        ("fast, 2 processes + normalize", lambda b: fast(b, 2), 2),
    ]
    results: dict[str, tuple[float, float, int]] = {}
    for label, fn, procs in cases:
        with console.status(f"measuring {label}"):
            wall, cpu = measure(fn, bodies, args.runs)
            results[label] = (n / wall, n / cpu, procs)
    for workers in (1, 2):
        label = f"spool -> Parquet end to end, {workers} process{'es' if workers > 1 else ''}"
        with console.status(f"measuring {label}"):
            wall, cpu = measure(lambda b, w=workers: spool_to_parquet(b, w), bodies, args.runs)
            results[label] = (n / wall, n / cpu, workers)
    shutdown()
    _print(console, results, n, size, len(bodies), args.runs)
    return 0


def _print(console: Console, results: dict[str, tuple[float, float, int]], n: int, size: int, batches: int,
           runs: int) -> None:
    base = results["naive loop + normalize"][1]
    base_cols = results["naive loop, base columns"][1]
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    table = Table(title=f"{n} spans in {batches} batches, {size / n:.0f} B/span, median of {runs} runs, "
                        f"load average {load}")
    for col in ("case", "processes", "spans/s (wall)", "spans per CPU-second", "x naive per CPU-second"):
        table.add_column(col, justify="right" if col != "case" else "left")
    for label, (rate, cpu_rate, procs) in results.items():
        ref = base_cols if "base" in label else base  # end to end: against the naive conversion alone
        ratio = "" if label.startswith("parse") else f"{cpu_rate / ref:.2f}"
        table.add_row(label, str(procs), f"{rate:,.0f}", f"{cpu_rate:,.0f}", ratio)
    console.print(table)
    console.print("spans per CPU-second = spans / (CPU seconds of this process and its workers): the "
                  "per-core rate, little affected by other load on the machine.")


if __name__ == "__main__":
    sys.exit(main())
