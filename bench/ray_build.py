"""Benchmark of ``tracedag build --engine ray`` beside the local engine, measured in the same run.

A generated store (``bench/build.py``'s ``ensure_store``: ``bench/gen.py``, sizes above 1M made by
copying the 1M store with fresh trace ids) is built from scratch ``--runs`` times per engine, each
run on a fresh store whose spans files are hard links of the generated ones:

- ``local``: ``build_store(data, idle_seconds=0, full=True)`` in this process (the baseline);
- ``ray N``: the same with ``engine=Engine(workers=N)`` on a local Ray cluster of N CPUs started
  before the timing (its start-up, about 4 s, is printed apart: a long-lived cluster pays it once).

``--hours H`` (default 1) spreads the arrivals over H receive hours first (the spans files, in
order, get H consecutive hours added to their received times), like a store a collector filled
over H hours: each bucket then reads only its hours. With 1 hour (a bulk ``tracedag ingest``)
every bucket reads every file, filtered (spans files are not sorted by trace id).

Printed: the median seconds, spans per second, the ratio to local, the tasks per build and the
load average (the machine is shared). With ``--profile`` one Ray run also reports where the driver
spent its time (waiting for tasks vs writing the results).

    python bench/ray_build.py                       # 200k spans, 3 runs, local + Ray 1 and 2 workers
    python bench/ray_build.py --spans 1000000 --runs 3 --hours 24
    python bench/ray_build.py --spans 5000000 --runs 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build import ensure_store  # bench/build.py, run as a script beside this one


def fresh_copy(spans_store: Path, target: Path) -> Path:
    """A store at ``target`` whose spans files are hard links of ``spans_store``'s (nothing built)."""
    if target.exists():
        shutil.rmtree(target)
    src = spans_store / "tables" / "spans"
    for f in src.rglob("*.parquet"):
        dst = target / "tables" / "spans" / f.relative_to(src)
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.link(f, dst)
    return target


HOUR_NS = 3600 * 10**9


def spread_store(src: Path, dst: Path, hours: int) -> Path:
    """A copy of ``src`` whose spans files (in path order) arrive over ``hours`` consecutive hours."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from tracedag.pipeline.store.files import parquet_files
    from tracedag.pipeline.store.parquet import write_parquet_atomic
    from tracedag.schemas.layout import table_dir

    if (dst / "tables" / "spans").exists():
        return dst
    files = parquet_files(src, "spans")
    for i, f in enumerate(files):
        t = pq.read_table(f)
        hour = i * hours // len(files)
        col = t.schema.get_field_index("received_unix_nano")
        t = t.set_column(col, t.schema.field(col), pc.add(t.column(col), hour * HOUR_NS))
        write_parquet_atomic(t, table_dir(dst, "spans") / f"hour={hour:03d}", f"part-{i:05d}")
    print(f"spread {src} over {hours} hours into {dst}", flush=True)
    return dst


def timed_builds(spans_store: Path, work: Path, runs: int, engine: object | None) -> tuple[list[float], int, int]:
    """Seconds of ``runs`` full builds (each on a fresh copy), the spans built and the tasks per build."""
    from tracedag.pipeline.dag import build_store

    seconds, spans, tasks = [], 0, 0
    for _ in range(runs):
        data = fresh_copy(spans_store, work)
        t = time.perf_counter()
        stats = build_store(data, idle_seconds=0, full=True, engine=engine)  # type: ignore[arg-type]
        seconds.append(time.perf_counter() - t)
        spans, tasks = stats.spans, stats.tasks
    shutil.rmtree(work, ignore_errors=True)
    return seconds, spans, tasks


def main(argv: list[str] | None = None) -> int:
    """Build the store with the local engine, then on Ray with each worker count; print the medians."""
    ap = argparse.ArgumentParser(description="tracedag build: local engine vs Ray")
    ap.add_argument("--spans", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/tracedag-bench"))
    ap.add_argument("--hours", type=int, default=1, help="spread the arrivals over this many receive hours")
    args = ap.parse_args(argv)
    import ray

    from tracedag.pipeline.engine import Engine

    store = ensure_store(args.dir, args.spans)
    if args.hours > 1:
        store = spread_store(store, args.dir / f"spans-{args.spans}-{args.hours}h", args.hours)
    work = args.dir / "ray-build-run"
    print(f"{'engine':>8} {'tasks':>5} {'median s':>9} {'min s':>7} {'spans/s':>10} {'vs local':>8} {'start s':>7} {'load':>5}")
    local, spans, _ = timed_builds(store, work, args.runs, None)
    base = statistics.median(local)
    print(f"{'local':>8} {0:>5} {base:>9.2f} {min(local):>7.2f} {spans / base:>10,.0f} {1.0:>8.2f} {'-':>7} "
          f"{os.getloadavg()[0]:>5.1f}", flush=True)
    for n in args.workers:
        engine = Engine(workers=n)
        t = time.perf_counter()
        engine.start()
        start = time.perf_counter() - t
        try:
            secs, spans, tasks = timed_builds(store, work, args.runs, engine)
        finally:
            engine.close()
            if ray.is_initialized():
                ray.shutdown()
        med = statistics.median(secs)
        print(f"{'ray ' + str(n):>8} {tasks:>5} {med:>9.2f} {min(secs):>7.2f} {spans / med:>10,.0f} {base / med:>8.2f} "
              f"{start:>7.1f} {os.getloadavg()[0]:>5.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
