"""What value provenance (``score.provenance``, issue #30 class 5) costs a score run, beside same-run baselines.

Builds a store with ``bench/gen.py`` (about ``--spans`` spans: agent turns whose tool calls carry JSON
arguments and results, about 8 % of them failing) and ``build_store``, then, in each of ``--runs`` runs,
on a fresh copy of the built, unscored store:

- ``score_store`` (rules, evaluations, the data edges, materialization): what a user's score run costs;
- ``provenance_round`` alone over the same scored files, right after (the edges are stored already, so
  it computes them all again and writes none): the share of the score run that provenance takes;
- baseline, a full scan of ``dag_nodes`` (``count(*)``, as bench/queries.py), the floor of any query.

Prints the medians over the runs (wall seconds), the data edges stored, and each line's ratio to
``score_store``.

    python bench/provenance.py --spans 100000 --runs 3 --data /tmp/bench-provenance
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gen

from tracedag.pipeline.dag import build_store
from tracedag.pipeline.score import score_store
from tracedag.pipeline.score.provenance import provenance_round
from tracedag.pipeline.store.files import parquet_files
from tracedag.pipeline.store.views import connect


def _timed(fn: Callable[[], object]) -> tuple[float, object]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def _scan(data: Path) -> int:
    con = connect(data)
    try:
        return int(con.sql("select count(*) from dag_nodes").fetchall()[0][0])
    finally:
        con.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spans", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--data", type=Path, default=Path("/tmp/bench-provenance"))
    args = ap.parse_args(argv)
    built = args.data / "built"
    shutil.rmtree(args.data, ignore_errors=True)
    n = gen.make_store(built, args.spans)
    build_store(built, idle_seconds=0)
    times: dict[str, list[float]] = {"score_store": [], "provenance_round": [], "scan dag_nodes": []}
    edges = 0
    for i in range(args.runs):
        run = args.data / f"run{i}"
        shutil.copytree(built, run)
        t, stats = _timed(lambda run=run: score_store(run))
        times["score_store"].append(t)
        edges = stats.data_edges  # type: ignore[attr-defined]
        files = parquet_files(run, "step_scores")
        times["provenance_round"].append(_timed(lambda run=run, files=files: provenance_round(run, files))[0])
        times["scan dag_nodes"].append(_timed(lambda run=run: _scan(run))[0])
        shutil.rmtree(run)
    base = statistics.median(times["score_store"])
    print(f"{n} spans, {args.runs} runs, {edges} data edges stored by a score run")
    print(f"{'step':20} {'median s':>10} {'x score_store':>14}")
    for name, samples in times.items():
        m = statistics.median(samples)
        print(f"{name:20} {m:>10.3f} {m / base:>14.3f}")


if __name__ == "__main__":
    main()
