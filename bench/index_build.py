"""Benchmark: a long-lived process's first read of which trace ids each file holds (``store.fileids``), per table.

A collector's passes, a server and a poller keep each file's trace ids as sorted 64-bit hashes (``store.fileids``),
read once per file: on a store a collector fills in ~20 minutes (the 10M-span bench store, 870k traces) a process
reads every file's once, at its second search. Before, every row's ``trace_id`` was read and its distinct values
found, then hashed and made distinct with NumPy's ``unique`` (a hash table first in NumPy 2, slow on a million
distinct values); now each row group's dictionary is read as such (``fileids.trace_ids``) and the hashes made
distinct by a radix sort and one pass (``hashes.sorted_unique``). Both are timed here in the same process,
alternated, after a pass that brings the files into the page cache: the CPU of reading every file's trace ids of
each table, medians of ``--runs``.

    python bench/index_build.py --data /tmp/tracedag-bench-queries/spans-10000000 --runs 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from rich.console import Console
from rich.table import Table

from tracedag.pipeline.store import fileids
from tracedag.pipeline.store.files import parquet_files
from tracedag.pipeline.store.hashes import sorted_unique

TABLES = ("traces", "dag_nodes", "dag_edges", "step_scores", "spans")
WAYS = {
    "every id, NumPy unique (before)": (lambda path: pq.read_table(path, columns=["trace_id"]).column("trace_id"),
                                        np.unique),
    "dictionaries, radix sort (now)": (fileids.trace_ids, sorted_unique),
}


def _read_all(table: str, files: list[Path]) -> tuple[float, list[np.ndarray]]:
    """The CPU of reading every file's trace ids of ``table`` (nothing kept before), and the hashes kept."""
    fileids.forget()
    c = time.process_time()
    kept = [fileids.file_hashes(stamp) for stamp in fileids.stamps(files)]
    return time.process_time() - c, kept


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path("/tmp/tracedag-bench-queries/spans-10000000"))
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    got: dict[tuple[str, str], list[float]] = {}
    hashes: dict[tuple[str, str], list[np.ndarray]] = {}
    for table in TABLES:
        files = parquet_files(args.data, table)
        _read_all(table, files)  # the page cache
        for run in range(args.runs):
            for way in list(WAYS) if run % 2 == 0 else list(WAYS)[::-1]:
                fileids.trace_ids, fileids.sorted_unique = WAYS[way]  # type: ignore[assignment]
                cpu, hashes[table, way] = _read_all(table, files)
                got.setdefault((table, way), []).append(cpu)
        before, now = (hashes[table, w] for w in WAYS)
        if len(before) != len(now) or not all(np.array_equal(a, b) for a, b in zip(before, now, strict=True)):
            raise SystemExit(f"{table}: the two ways kept different hashes")
    fileids.trace_ids, fileids.sorted_unique = WAYS["dictionaries, radix sort (now)"]  # type: ignore[assignment]
    out = Table(title=f"{args.data}: every file's trace ids read and kept, CPU s, median of {args.runs}; "
                      f"load average {os.getloadavg()[0]:.1f}")
    for col in ("table", "files", *WAYS, "ratio"):
        out.add_column(col, justify="right")
    total = {w: 0.0 for w in WAYS}
    for table in TABLES:
        cells = [statistics.median(got[table, w]) for w in WAYS]
        for w, v in zip(WAYS, cells, strict=True):
            total[w] += v
        out.add_row(table, str(len(parquet_files(args.data, table))), *(f"{v:.2f}" for v in cells),
                    f"{cells[1] / cells[0]:.2f}")
    first, second = total.values()
    out.add_row("all", "", f"{first:.2f}", f"{second:.2f}", f"{second / first:.2f}")
    Console().print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
