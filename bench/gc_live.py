"""Benchmark: which rows of a file the collection keeps, against the store's live pairs (``store.gc.live_mask``).

The collection (``tracedag build``'s, and the live collector's own thread every 10 s) reads each file it rewrites or
merges and keeps the rows of each trace's latest build. It asked ``pc.is_in(keys, value_set=live pairs)``, which
hashes every live pair of the store again at each call: O(store) per file. ``Liveness.holds`` hashes them once and
searches the sorted hashes. Both are timed here on the same files of the same store, in the same run (the old call
is the baseline), with the rows each keeps compared (a dead row whose hash is a live pair's is kept: counted).

    python bench/gc_live.py --data /tmp/tracedag-bench-queries/spans-1000000 --files 40 --runs 3
    python bench/gc_live.py --data ... --rows 5000     # files of a live collector's size

Without ``--data`` a store of ``--spans`` spans is generated (``bench/gen.py``) and built first.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import gen
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from rich.console import Console
from rich.table import Table

from tracedag.pipeline.store.files import parquet_files
from tracedag.pipeline.store.gc import liveness

TABLES = ("traces", "dag_nodes", "dag_edges", "step_scores")


def _cpu(fn) -> float:  # type: ignore[no-untyped-def]
    t = time.process_time()
    fn()
    return time.process_time() - t


def _keys(path: Path, most: int | None) -> pa.Array:
    t = pq.read_table(path, columns=["trace_id", "build_id"])
    t = t if most is None else t.slice(0, most)
    return pc.binary_join_element_wise(t.column("trace_id"), t.column("build_id"), "\x1f").combine_chunks()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=None, help="a built store (default: one of --spans spans, generated and built)")
    ap.add_argument("--spans", type=int, default=1_000_000)
    ap.add_argument("--files", type=int, default=40, help="files timed (spread over the tables)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rows", type=int, default=None,
                    help="time the first ROWS rows of each file, as the small files a live collector merges")
    args = ap.parse_args(argv)
    data = gen.built_store(args.data, args.spans)
    t0 = time.process_time()
    lv = liveness(data)
    read_cpu = time.process_time() - t0
    build_cpu = _cpu(lambda: lv.key_hashes)
    per_table = max(1, args.files // len(TABLES))
    files = [f for t in TABLES for f in parquet_files(data, t)[:per_table]]
    old, new, rows, kept_more = [], [], 0, 0
    for f in files:
        keys = _keys(f, args.rows)
        rows += len(keys)
        exact = pc.is_in(keys, value_set=lv.keys).to_numpy(zero_copy_only=False)
        kept_more += int((lv.holds(keys) & ~exact).sum())
        if int((exact & ~lv.holds(keys)).sum()):
            raise SystemExit(f"{f}: a live row would be dropped")
        old.append(statistics.median(_cpu(lambda k=keys: pc.is_in(k, value_set=lv.keys)) for _ in range(args.runs)))
        new.append(statistics.median(_cpu(lambda k=keys: lv.holds(k)) for _ in range(args.runs)))
    table = Table(title=f"{data}: {len(lv.keys):,} live pairs; {len(files)} files, {rows:,} rows; median of "
                        f"{args.runs} per file; load average {os.getloadavg()[0]:.1f}")
    for col in ("per file, CPU s", "median", "max", "sum over the files", "x baseline"):
        table.add_column(col, justify="right")
    table.add_row("is_in (baseline)", f"{statistics.median(old):.4f}", f"{max(old):.4f}", f"{sum(old):.2f}", "1.00")
    table.add_row("Liveness.holds", f"{statistics.median(new):.4f}", f"{max(new):.4f}", f"{sum(new):.2f}",
                  f"{sum(new) / sum(old):.3f}")
    Console().print(table)
    print(f"liveness read {read_cpu:.2f} s CPU; its hashes made once {build_cpu:.2f} s CPU; "
          f"dead rows kept by a hash collision: {kept_more}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
