"""Benchmark of ``score_store`` without a judge (rules + evaluations), beside a read-only baseline.

Builds a store with ``bench/gen.py`` (about ``--spans`` spans) and ``build_store``, then for each
run removes ``tables/step_scores`` and scores every step again. The baseline, measured in the
same run, only reads the scorer's inputs (the step-facts query) into Arrow: the I/O floor.

    python bench/score.py --spans 100000 --runs 3 --data /tmp/bench-score
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gen

from tracedag.pipeline.dag import build_store
from tracedag.pipeline.score import inputs, score_store
from tracedag.pipeline.store import files as store
from tracedag.pipeline.store.views import connect
from tracedag.schemas.layout import table_dir


def _median(fn: Callable[[], int], runs: int) -> tuple[float, int]:
    times, n = [], 0
    for _ in range(runs):
        t0 = time.perf_counter()
        n = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), n


def _baseline(data: Path) -> int:
    con = connect(data)
    try:
        con.register("pending", inputs.pending_rule_builds(con))
        return con.sql(inputs.FACTS_CORE_SQL).to_arrow_table().num_rows
    finally:
        con.close()


def _score(data: Path) -> int:
    shutil.rmtree(table_dir(data, "step_scores"), ignore_errors=True)
    return score_store(data).steps


def main(argv: list[str] | None = None) -> int:
    """Build the store if needed, time baseline and scoring, print a table."""
    ap = argparse.ArgumentParser(description="score_store benchmark (rules + evaluations)")
    ap.add_argument("--spans", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--data", type=Path, default=Path("/tmp/tracedag-bench-score"))
    args = ap.parse_args(argv)
    if not store.parquet_files(args.data, "spans"):
        gen.make_store(args.data, args.spans)
    if not store.parquet_files(args.data, "traces"):
        build_store(args.data, idle_seconds=0, full=True)
    shutil.rmtree(table_dir(args.data, "step_scores"), ignore_errors=True)
    base, steps = _median(lambda: _baseline(args.data), args.runs)
    scored, _ = _median(lambda: _score(args.data), args.runs)
    t = Table(title=f"score_store, {steps} steps, median of {args.runs} runs")
    for col in ("what", "seconds", "steps/s", "ratio to baseline"):
        t.add_column(col, justify="left" if col == "what" else "right")
    t.add_row("baseline: read step facts", f"{base:.2f}", f"{steps / base:,.0f}", "1.0")
    t.add_row("score_store (rules + evaluations)", f"{scored:.2f}", f"{steps / scored:,.0f}", f"{scored / base:.1f}")
    Console().print(t)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
