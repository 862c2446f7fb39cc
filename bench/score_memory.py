"""Benchmark (issue #31): peak memory of storing the named queries' results of every trace, in one round (before:
DuckDB's default memory limit, 80 % of RAM) and in parts (``tracedag score --materialize-part``, a memory limit of
half the available memory), on copies of the same built and scored store, in the same run.

Each way runs ``materialize`` in a process of its own on a fresh copy of the store's built and scored tables (no
stored results), and prints its wall and CPU seconds and peak resident memory (``wait4``), and the ratios of the
parts to the one round. ``--fraction`` first derives a smaller store from ``--from`` (that share of its traces, every
table, streamed), so a 10M-span store gives a 1M one.

    nice -n 10 python bench/score_memory.py --from /tmp/q10m/spans-10000000 --fraction 0.1 --dir /tmp/scoremem \\
        --part 20000
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq

TABLES = ("spans", "traces", "dag_nodes", "dag_edges", "step_scores")
"""What a built and scored store holds before its results are stored (copied for each way)."""

_CHILD = """
import sys
from pathlib import Path
from tracedag.pipeline.score.materialize import materialize
data, part, memory = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
stats = materialize(data, [], part=part, memory=int(memory) if memory != "-" else None)
print(stats.traces, sum(stats.rows.values()))
"""


def derive(src: Path, dst: Path, fraction: float) -> None:
    """``dst``: every ``round(1 / fraction)``-th trace of ``src`` (by id) with its rows of every table, streamed a
    batch at a time (DuckDB's copy of 5 % of a 10M-span store's spans took over 12 GB, or spilled 13 GB at a 3 GB
    limit)."""
    if (dst / "tables" / "traces").is_dir():
        return
    ids = pq.read_table(src / "tables" / "traces", columns=["trace_id"]).column("trace_id")
    ids = pc.unique(ids).sort()[:: max(1, round(1 / fraction))]
    for table in TABLES:
        for path in sorted((src / "tables" / table).rglob("*.parquet")):
            pf = pq.ParquetFile(path)
            out = dst / "tables" / table / path.relative_to(src / "tables" / table)
            out.parent.mkdir(parents=True, exist_ok=True)
            with pq.ParquetWriter(out, pf.schema_arrow, compression="zstd") as writer:
                for batch in pf.iter_batches(batch_size=64 * 1024):
                    writer.write_batch(batch.filter(pc.is_in(batch.column("trace_id"), value_set=ids)))


def _copy(src: Path, dst: Path) -> None:
    """``dst``: the tables of ``src`` a scored store has before any result is stored."""
    shutil.rmtree(dst, ignore_errors=True)
    for table in TABLES:
        shutil.copytree(src / "tables" / table, dst / "tables" / table)


def _run(data: Path, part: int, memory: int | None) -> dict[str, float]:
    """Materialize ``data`` in a child process; its wall and CPU seconds, peak RSS (MB), traces and rows."""
    t0 = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(data), str(part), str(memory or "-")],
                             stdout=subprocess.PIPE, text=True)
    out = child.stdout.read() if child.stdout else ""
    _pid, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        raise SystemExit(f"materialize of {data} failed with status {child.returncode}")
    traces, rows = (int(x) for x in out.split()[-2:])
    return {"wall": time.perf_counter() - t0, "cpu": usage.ru_utime + usage.ru_stime,
            "rss_mb": usage.ru_maxrss / 1024, "traces": traces, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="peak memory of storing the named queries' results: one round vs parts")
    ap.add_argument("--from", dest="src", type=Path, required=True, help="a built and scored store")
    ap.add_argument("--fraction", type=float, default=1.0, help="derive a store of this share of its traces first")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/tracedag-bench-score-memory"))
    ap.add_argument("--part", type=int, default=20_000, help="traces a part (tracedag score --materialize-part)")
    ap.add_argument("--memory-mb", type=int, help="also parts at this DuckDB memory limit (--memory-limit)")
    args = ap.parse_args(argv)
    source = args.src
    if args.fraction < 1:
        source = args.dir / "derived"
        derive(args.src, source, args.fraction)
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    ways = {"one round, DuckDB's default limit (before)": (10**12, int(total * 0.8)),
            f"parts of {args.part}, default limit (now)": (args.part, None)}
    if args.memory_mb:
        ways[f"parts of {args.part}, {args.memory_mb} MB limit"] = (args.part, args.memory_mb * 2**20)
    figures = {}
    for label, (part, memory) in ways.items():
        data = args.dir / "copy"
        _copy(source, data)
        figures[label] = _run(data, part, memory)
        f = figures[label]
        print(f"{label:48s} wall {f['wall']:8.1f} s  cpu {f['cpu']:8.1f} s  peak rss {f['rss_mb']:8.0f} MB  "
              f"{f['traces']:.0f} traces, {f['rows']:.0f} rows  load {os.getloadavg()[0]:.1f}", flush=True)
    before = figures[next(iter(ways))]
    for label, now in list(figures.items())[1:]:
        print(f"{label} / one round: wall x{now['wall'] / before['wall']:.2f}, cpu x{now['cpu'] / before['cpu']:.2f}, "
              f"peak rss x{now['rss_mb'] / before['rss_mb']:.2f}")
    shutil.rmtree(args.dir / "copy", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
