"""Benchmark: what marking the root cause and its propagation path costs `tracedag show`.

`tracedag show TRACE_ID` reads the trace and its nodes (``load_trace``, the baseline: what show did
before #28) and now also finds the root cause and its propagation path for that
one trace (``load_shown``: one failure_dag_roots call on the same connection). Both are timed in the same run, alternated, on the same traces of a
store (default: a fresh ``tracedag demo`` store), and the medians and their ratio printed.

    python bench/show.py [--data DIR] [--traces 10] [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _demo_store() -> Path:
    data = Path(tempfile.mkdtemp(prefix="bench-show-")) / "data"
    subprocess.run([sys.executable, "-c", "from tracedag.pipeline.cli import cli; cli()", "demo", "--data", str(data)],
                   check=True, capture_output=True)
    return data


def _traces(data: Path, n: int) -> list[str]:
    from tracedag.pipeline.store.querying import run_sql

    table = run_sql(data, f"select distinct trace_id from step_scores where score <= 2 order by 1 limit {n}")
    return [str(t) for t in table.column("trace_id").to_pylist()]


def _seconds(fn: object, *args: object) -> float:
    start = time.perf_counter()
    fn(*args)  # type: ignore[operator]
    return time.perf_counter() - start


def main() -> None:
    """Time load_trace (the trace and its nodes) and load_shown (also the cause) on failed traces."""
    from tracedag.pipeline.dag.show import load_shown, load_trace

    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path)
    ap.add_argument("--traces", type=int, default=10)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    data = args.data or _demo_store()
    traces = _traces(data, args.traces)
    before: list[float] = []
    after: list[float] = []
    for _ in range(args.runs):
        for t in traces:
            before.append(_seconds(load_trace, data, t))
            after.append(_seconds(load_shown, data, t))
    b, a = statistics.median(before), statistics.median(after)
    print(f"store {data}: {len(traces)} failed traces x {args.runs} runs")
    print(f"show before #28 (load_trace):              median {b * 1000:.0f} ms")
    print(f"show with the root cause (load_shown):    median {a * 1000:.0f} ms  (x{a / b:.2f})")


if __name__ == "__main__":
    main()
