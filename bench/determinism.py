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

``--unlabelled``: production-like spans without run labels instead (``bench/gen.py``: four agents,
one-trace conversations, no scenario_id), so each agent's runs form one scenario of thousands of
runs, where the pairwise means are estimated from sampled pairs. Measures ``analyze`` in process and
the ``tracedag determinism`` command end to end (a fresh process, tables and pictures written),
the median of ``--runs`` runs each, beside the same baseline scan and the ``run_steps`` query (the
read of the spans the analysis starts with; also a median); and, once, the old exact
pairwise means (replay coverage in SQL and offline response consistency, with the sampling
threshold lifted) on the first ``--sample-runs`` runs of the largest group, extrapolated
quadratically to every group. ``--data DIR`` keeps the store there (made once, reused after).

    python bench/determinism.py --unlabelled --spans 300000 --runs 3
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

import duckdb  # noqa: E402
import gen  # noqa: E402
from realspans import to_table  # noqa: E402

from tracedag import queries  # noqa: E402
from tracedag.pipeline.analysis.determinism import analyze, write_outputs  # noqa: E402
from tracedag.pipeline.analysis.pairs import PAIR_SAMPLE, mean_pairwise_jaccard  # noqa: E402
from tracedag.pipeline.analysis.paths import enumerate_paths  # noqa: E402
from tracedag.pipeline.analysis.response import tokens  # noqa: E402
from tracedag.pipeline.analysis.trajectories import Run, runs_table  # noqa: E402
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


EXACT = 2**62
"""A sampling threshold no group reaches: the same query and function compute the old exact means."""
CLI = [sys.executable, "-c", "from tracedag.pipeline.cli import cli; cli()", "determinism"]


def unlabelled_store(data: Path, n_spans: int) -> int:
    """``data`` as a store of about ``n_spans`` generated spans without run labels (made once)."""
    files = list((data / "tables" / "spans").rglob("*.parquet")) if data.exists() else []
    if not files:
        gen.make_store(data, n_spans, seed=0)
    row = connect(data).execute("select count(*) from spans").fetchone()
    return int(row[0]) if row else 0


def old_exact_seconds(runs: list[Run], sample_runs: int) -> tuple[float, int]:
    """Time the exact pairwise means (SQL coverage + offline response consistency) on the first
    ``sample_runs`` runs of the largest group; return the time extrapolated quadratically to every
    group, and the runs timed."""
    sizes = Counter((r.agent, r.agent_version, r.scenario) for r in runs)
    largest = sizes.most_common(1)[0][0]
    sample = [r for r in runs if (r.agent, r.agent_version, r.scenario) == largest][:sample_runs]
    con = duckdb.connect()
    con.register("run_paths", runs_table(sample))
    exact_sql = queries.load("determinism").replace(f"select {PAIR_SAMPLE} as pair_sample", f"select {EXACT} as pair_sample")
    t0 = time.perf_counter()
    con.sql(exact_sql).fetchall()
    mean_pairwise_jaccard([tokens(r.final_response) for r in sample], "bench", sample=EXACT)
    seconds = time.perf_counter() - t0
    m = len(sample)
    return seconds * sum((n / m) ** 2 for n in sizes.values()), m


def bench_unlabelled(data: Path, n_spans: int, runs: int, sample_runs: int) -> Table:
    """The 300k-unlabelled case: baseline scan, analyze, the CLI end to end, the old exact extrapolated."""
    spans = unlabelled_store(data, n_spans)
    baseline = median_time(lambda: connect(data).execute(BASELINE).fetchall(), runs)
    steps_sql = queries.load("run_steps")
    t_read = median_time(lambda: connect(data).execute(steps_sql).fetchall(), runs)
    result = analyze(data)
    t_an = median_time(lambda: analyze(data), runs)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [*CLI, "--data", str(data), "--output", tmp]
        t_cli = median_time(lambda: subprocess.run(cmd, check=True, capture_output=True), runs)
    t_old, m = old_exact_seconds(result.runs, sample_runs)
    groups = Counter((r.agent, r.scenario) for r in result.runs)
    table = Table(title=f"tracedag determinism, unlabelled: {spans:,} spans, {len(result.runs):,} runs in "
                        f"{len(groups)} scenarios (largest {max(groups.values()):,} runs); median of {runs} runs")
    for col in ("what", "seconds", "vs scan", "vs run_steps"):
        table.add_column(col, justify="left" if col == "what" else "right")
    rows = [("baseline: group-by scan of spans", baseline),
            ("baseline: run_steps query (the spans the analysis reads)", t_read),
            ("analyze (in process)", t_an), ("tracedag determinism (new process, end to end)", t_cli),
            (f"old exact pairwise means only (timed on {m:,} runs, extrapolated)", t_old)]
    for name, t in rows:
        table.add_row(name, f"{t:.2f}", f"{t / baseline:.1f}x", f"{t / t_read:.1f}x")
    return table


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print a table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="25000,100000", help="store sizes in spans, comma separated")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--unlabelled", action="store_true", help="production-like spans without run labels")
    ap.add_argument("--spans", type=int, default=300_000, help="--unlabelled: store size in spans")
    ap.add_argument("--data", type=Path, default=None, help="--unlabelled: keep (and reuse) the store here")
    ap.add_argument("--sample-runs", type=int, default=1000, help="--unlabelled: runs the old exact means are timed on")
    args = ap.parse_args(argv)
    if args.unlabelled:
        with tempfile.TemporaryDirectory() as tmp:
            data = args.data or Path(tmp) / "data"
            Console().print(bench_unlabelled(data, args.spans, args.runs, args.sample_runs))
        return 0
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
