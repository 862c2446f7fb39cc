"""Benchmark: finding the files that hold a pass's traces (``store.mixed.narrowed``), by a scan and by the kept ids.

A live collector's store pass, a server's trace view and each part of a scoring run copy the rows of some traces
(a pass: the ~1,300 traces of a round at 10k spans/s) from the files that hold them. The scan of the ``trace_id``
column of every file of the five tables (the baseline, in the same run) grows with the store; a process that
searched the store before reads each file's ids once (``mixedkept.files_holding``) and then only new files.
Printed: CPU and wall of the scan and of the kept-ids search (median of ``--runs``), the one-time cost of reading
every file's ids, and how many hashes the process keeps (8 bytes each). The files found are checked equal.

    python bench/narrowed.py --data /tmp/tracedag-bench-queries/spans-10000000 --traces 1300 --runs 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import gen
import pyarrow as pa
from rich.console import Console
from rich.table import Table

from tracedag.pipeline.store import fileids, mixed, mixedkept
from tracedag.pipeline.store.files import parquet_files
from tracedag.pipeline.store.views import _LATEST, connect

RELATION = "__bench_wanted"


def timed(fn) -> tuple[float, float, object]:  # type: ignore[no-untyped-def]
    """(CPU s, wall s, result) of ``fn()``."""
    c, w = time.process_time(), time.perf_counter()
    out = fn()
    return time.process_time() - c, time.perf_counter() - w, out


def ratio_table(title: str, rows: list[tuple[str, list[tuple[float, float, object]]]]) -> Table:
    """A table of each search's median CPU and wall seconds (``timed`` results) and its CPU against the first row's."""
    table = Table(title=title)
    for col in ("search", "CPU s", "wall s", "x baseline (CPU)"):
        table.add_column(col, justify="right")
    base = statistics.median(r[0] for r in rows[0][1])
    for label, runs in rows:
        cpu = statistics.median(r[0] for r in runs)
        table.add_row(label, f"{cpu:.3f}", f"{statistics.median(r[1] for r in runs):.3f}", f"{cpu / base:.3f}")
    return table


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=None, help="a built store (default: one of --spans spans)")
    ap.add_argument("--spans", type=int, default=1_000_000)
    ap.add_argument("--traces", type=int, default=1300, help="traces a pass copies (sampled from the store)")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    data = gen.built_store(args.data, args.spans)
    con = connect(data)
    ids = [r[0] for r in con.execute(f"select trace_id from traces_all using sample {args.traces} rows").fetchall()]
    con.register(RELATION, pa.table({"trace_id": pa.array(ids, pa.string())}))
    mixedkept.forget()
    scans = [timed(lambda: mixed.narrowed(con, data, RELATION)) for _ in range(args.runs)]  # the first search scans
    mixedkept.forget()
    mixed.narrowed(con, data, RELATION)  # marks the store as searched
    first = timed(lambda: mixed.narrowed(con, data, RELATION))  # reads every file's ids once
    kept = [timed(lambda: mixed.narrowed(con, data, RELATION)) for _ in range(args.runs)]
    if kept[-1][2] != scans[-1][2]:
        raise SystemExit("the kept ids found other files than the scan")
    hashes = sum(len(a) for a in fileids._IDS.values())
    files = sum(len(parquet_files(data, t)) for t in _LATEST)
    title = (f"{data}: {args.traces} traces sought in {files} files of {len(_LATEST)} tables; median of {args.runs}; "
             f"load average {os.getloadavg()[0]:.1f}")
    table = ratio_table(title, [("scan of every file (baseline)", scans),
                                ("kept ids, first (every file read once)", [first]), ("kept ids, later", kept)])
    Console().print(table)
    print(f"kept: {hashes:,} hashes ({hashes * 8 / 2**20:.0f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
