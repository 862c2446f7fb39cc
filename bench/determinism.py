"""Benchmark: ``tracedag determinism`` (run extraction + every analysis query + pictures) by store size.

Store: the bundled court-booking agent simulated once (both agent variants, every DFS path of the
constrained graph with max 2 visits, 3 replays and 2 variants each), its spans normalized and then
copied with fresh trace, span and run ids until the store has about ``--sizes`` spans. So the
store has real node, tool and LLM spans, run labels and intended paths, like the demo's.

Baseline, measured in the same run: one full group-by scan of the ``spans`` view
(``select trace_id, count(*), max(end_time_unix_nano) from spans group by trace_id``).
Prints the median of ``--runs`` runs of the baseline, of ``analyze`` and of ``write_outputs``,
and the ratio to the baseline.

    python bench/determinism.py --sizes 25000,100000 --runs 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from realspans import to_table  # noqa: E402

from tracedag.pipeline.analysis.determinism import analyze, write_outputs  # noqa: E402
from tracedag.pipeline.analysis.paths import enumerate_paths  # noqa: E402
from tracedag.pipeline.demo.agent import booking_graph  # noqa: E402
from tracedag.pipeline.demo.simulate import SimulationConfig, simulate  # noqa: E402
from tracedag.pipeline.store.parquet import write_parquet_atomic  # noqa: E402
from tracedag.pipeline.store.views import connect  # noqa: E402
from tracedag.schemas.agent_graph import parse_graph  # noqa: E402
from tracedag.schemas.layout import table_dir  # noqa: E402

BASELINE = "select trace_id, count(*), max(end_time_unix_nano) from spans group by trace_id"


def simulated_spans() -> pa.Table:
    """One simulation of the example agent, normalized."""
    graph = parse_graph(booking_graph.agent_graph("constrained"))
    exporter = InMemorySpanExporter()
    config = SimulationConfig(endpoint="http://127.0.0.1:9", latency_scale=0.0)
    simulate(config, list(enumerate_paths(graph, 2)), exporter=exporter)
    return to_table(exporter.get_finished_spans())


def _suffixed(table: pa.Table, k: int) -> pa.Table:
    """A copy of ``table`` whose ids end in ``k`` (a distinct set of traces and runs)."""
    tag = f"{k:06x}"
    for col in ("trace_id", "span_id", "parent_span_id", "run_id", "conversation_id"):
        i = table.schema.get_field_index(col)
        table = table.set_column(i, col, pc.binary_join_element_wise(table[col], pa.scalar(tag), ""))
    return table


def make_store(data: Path, base: pa.Table, n_spans: int) -> int:
    """Write copies of ``base`` until about ``n_spans`` spans; return the span count."""
    copies = max(1, round(n_spans / base.num_rows))
    for k in range(copies):
        write_parquet_atomic(_suffixed(base, k), table_dir(data, "spans"))
    return copies * base.num_rows


def median_time(fn: Callable[[], object], runs: int) -> float:
    """Median wall time of ``runs`` calls."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_size(base: pa.Table, n_spans: int, runs: int, table: Table) -> None:
    """Measure one store size and add its rows to ``table``."""
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        spans = make_store(data, base, n_spans)
        graphs = [parse_graph(booking_graph.agent_graph(v)) for v in booking_graph.VARIANTS]
        baseline = median_time(lambda: connect(data).execute(BASELINE).fetchall(), runs)
        result = analyze(data, graphs=graphs)
        t_an = median_time(lambda: analyze(data, graphs=graphs), runs)
        t_out = median_time(lambda: write_outputs(result, data, Path(tmp) / "out"), runs)
        n_runs = len(result.runs)
        for name, t in (("baseline scan", baseline), ("analyze", t_an), ("write_outputs", t_out)):
            table.add_row(f"{spans:,}", f"{n_runs:,}", name, f"{t * 1000:.0f} ms", f"{t / baseline:.1f}x")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print a table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="25000,100000", help="store sizes in spans, comma separated")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    base = simulated_spans()
    table = Table(title=f"tracedag determinism (median of {args.runs} runs; base simulation {base.num_rows} spans)")
    for col in ("spans", "runs", "what", "median", "vs baseline"):
        table.add_column(col, justify="left" if col == "what" else "right")
    for size in (int(s) for s in args.sizes.split(",")):
        bench_size(base, size, args.runs, table)
    Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
