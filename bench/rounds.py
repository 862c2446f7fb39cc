"""Benchmark of one live analysis round (build + score) as the store grows.

A live round builds the traces that completed in the last second and scores their steps. Its
cost must follow what arrived, not the size of the store, or a collector that has run for an hour
falls behind at any rate. For each ``--sizes`` value, a store of that many generated agent spans
is built and scored; then ``--rounds`` times, ``--batch`` new spans are ingested and one round runs
both ways, in alternation, on copies of the same store:

- incremental: what ``tracedag collect --build`` does (the build plan reads the new spans files,
  the scorer reads from the round's earliest arrival);
- full (the baseline, same run): the plan reads every spans file and the scorer every build and
  span, as every round did before.

Both ways store the named queries' results as the live collector does (``--store-results live``, the
default): not in the round (``LiveRound.materialize`` False) but by a thread of its own, off the round loop
(``score.live_store``), a part of at most ``CollectorConfig.materialize_part`` traces a pass; a part's
cost is timed once after the rounds (on the incremental copy, whose backlog the rounds left) and shown beside
the rounds (it runs on the other core, beside the rounds). ``--store-results
every-round`` stores them in every round, as ``tracedag score`` does (and live rounds did before 61784f8).

    python bench/rounds.py --sizes 200000 800000 1600000 --rounds 5

``--cpu`` times the process's CPU seconds (every thread's, DuckDB's included) instead of wall seconds: on a
machine shared with other work they move less. To time another checkout's code with this script, put a shim of it
first on ``PYTHONPATH`` (``bench/trace_by_id.py``'s ``_shim``).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench.gen import requests
from tracedag.pipeline.dag import build_store
from tracedag.pipeline.dag.window import clear_window
from tracedag.pipeline.ingest.direct import ingest_requests
from tracedag.pipeline.score import score_store
from tracedag.pipeline.score.runner import LiveRound, materialize_later
from tracedag.pipeline.service import CollectorConfig
from tracedag.schemas.layout import state_file

console = Console(width=140)
clock = time.perf_counter  # --cpu: time.process_time


def make_store(data: Path, spans: int, batch: int, progress: Progress) -> int:
    """Fill ``data`` with ``spans`` generated spans in batches (one file each), build and score it."""
    task = progress.add_task(f"store of {spans:,} spans", total=spans)
    seed = 1
    while seed * batch <= spans:
        ingest_requests(data, requests(batch, seed), received_unix_nano=time.time_ns())
        progress.advance(task, batch)
        seed += 1
    build_store(data, idle_seconds=0, grace_seconds=0)
    score_store(data)
    return seed


def one_round(data: Path, seed: int, batch: int, incremental: bool, store: bool) -> tuple[float, float, int]:
    """Ingest one batch, then build and score it (``store``: and store the named queries' results); return
    (build s, score s, traces built)."""
    ingest_requests(data, requests(batch, seed), received_unix_nano=time.time_ns())
    if not incremental:
        clear_window(data)  # the plan reads every spans file, as before
        state_file(data, "score-window.json").unlink(missing_ok=True)  # and the scorer every build
    t = clock()
    built = build_store(data, idle_seconds=0, grace_seconds=0)
    t_build = clock() - t
    live = LiveRound(built.build_id if built.traces_built else None, built.received_from, materialize=store)
    if not incremental:
        live = None if store else LiveRound(None, None, materialize=False)
    t = clock()
    score_store(data, live=live)
    return t_build, clock() - t, built.traces_built


def store_part(data: Path) -> tuple[float, int]:
    """Store one part of the named queries' results left by the rounds, as a busy live round does; return
    (seconds, traces stored)."""
    t = clock()
    stats = materialize_later(data, [], CollectorConfig.materialize_part)
    return clock() - t, stats.traces if stats is not None else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--sizes", type=int, nargs="+", default=[200_000, 800_000])
    ap.add_argument("--batch", type=int, default=40_000, help="spans arriving per round (one second at 40k/s)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--store-results", choices=["live", "every-round"], default="live",
                    help="live: rounds leave the named queries' results to the store's thread (a part of at most "
                         "materialize_part traces timed after the rounds), as tracedag collect --build does; "
                         "every-round: each round stores them")
    ap.add_argument("--cpu", action="store_true", help="time CPU seconds of the process, not wall seconds")
    args = ap.parse_args(argv)
    global clock
    clock = time.process_time if args.cpu else time.perf_counter
    import tracedag.pipeline
    console.print(f"tracedag from {Path(tracedag.pipeline.__file__).parent}")
    unit = "CPU seconds" if args.cpu else "seconds"
    table = Table(title=f"one live round ({args.batch:,} new spans): median of {args.rounds}, {unit}; named "
                        f"queries' results stored: {args.store_results}")
    for col in ("store spans", "full: build", "full: score", "full: round", "incremental: build",
                "incremental: score", "incremental: round", "ratio"):
        table.add_column(col, justify="right")
    if args.store_results == "live":
        table.add_column("then a part stored (traces), s", justify="right")
    for size in args.sizes:
        root = Path(tempfile.mkdtemp(prefix="tracedag-rounds-"))
        try:
            table.add_row(*row(root, size, args))
        finally:
            shutil.rmtree(root, ignore_errors=True)
    console.print(table)
    return 0


def row(root: Path, size: int, args: argparse.Namespace) -> list[str]:
    """Time ``args.rounds`` rounds each way on two copies of one store of ``size`` spans."""
    with Progress(console=console, transient=True) as progress:
        seed = make_store(root / "inc", size, args.batch, progress)
        shutil.copytree(root / "inc", root / "full")
        times: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        task = progress.add_task("rounds", total=2 * args.rounds)
        for r in range(args.rounds):
            for incremental in (r % 2 == 0, r % 2 != 0):  # alternate which goes first
                b, s, _ = one_round(root / ("inc" if incremental else "full"), seed + r, args.batch, incremental,
                                    args.store_results == "every-round")
                times[incremental].append((b, s))
                progress.advance(task)
        part = store_part(root / "inc") if args.store_results == "live" else None
    cells = [f"{size:,}"]
    rounds = {}
    for incremental in (False, True):
        b = statistics.median(t[0] for t in times[incremental])
        s = statistics.median(t[1] for t in times[incremental])
        rounds[incremental] = statistics.median(t[0] + t[1] for t in times[incremental])
        cells += [f"{b:.2f}", f"{s:.2f}", f"{rounds[incremental]:.2f}"]
    cells.append(f"{rounds[False] / rounds[True]:.1f}x")
    if part is not None:
        cells.append(f"{part[0]:.2f} ({part[1]:,})")
    return cells


if __name__ == "__main__":
    raise SystemExit(main())
