"""Benchmark of ``tracedag build`` (DAG reconstruction) at several store sizes.

For each size a store is made once with ``bench/gen.py`` (``make_store``; sizes above 1M spans are
made by copying the 1M store with fresh trace ids, which is much faster than generating), then
each measured run is a fresh process:

- ``scan`` (baseline): read the build's input columns of every span from Parquet (the I/O floor);
- ``build``: ``build_store(data, idle_seconds=0, full=True)``, everything rebuilt.

Wall time inside the child (interpreter start and imports excluded), CPU time (user+sys, imports
included, about 1 s) and peak RSS (``wait4`` rusage of the child) are medians over
``--runs``; ``load`` is the 1-minute load average when the size finished (the machine is shared:
CPU seconds are the figure that does not depend on the neighbours).

    python bench/build.py --sizes 100000 1000000 --runs 3 --dir /tmp/tracedag-bench
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

_CHILD = {
    "scan": """
import json, sys, time
from pathlib import Path
import pyarrow.dataset as ds
from tracedag.pipeline.dag.prep import INPUT_COLUMNS
from tracedag.pipeline.store import parquet_files
from tracedag.schemas.spans import SPANS_V1
t = time.perf_counter()
files = [str(f) for f in parquet_files(Path(sys.argv[1]), "spans")]
n = ds.dataset(files, schema=SPANS_V1, format="parquet").to_table(columns=INPUT_COLUMNS).num_rows
print(json.dumps({"seconds": time.perf_counter() - t, "spans": n}))
""",
    "build": """
import json, sys, time
from pathlib import Path
from tracedag.pipeline.dag import build_store
t = time.perf_counter()
s = build_store(Path(sys.argv[1]), idle_seconds=0, full=True)
print(json.dumps({"seconds": time.perf_counter() - t, "spans": s.spans, "traces": s.traces_built,
                  "edges": s.edges, "methods": s.methods}))
""",
}


def run_child(kind: str, data: Path) -> dict[str, float]:
    """Run one measurement in a fresh process; return its JSON plus wall seconds and peak RSS (MB)."""
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", _CHILD[kind], str(data)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} failed with exit code {proc.returncode}")
    result = json.loads(out)
    result["wall"] = time.perf_counter() - t
    result["rss_mb"] = usage.ru_maxrss / 1024
    result["cpu"] = usage.ru_utime + usage.ru_stime
    return result


def ensure_store(root: Path, n_spans: int) -> Path:
    """Return a store of about ``n_spans`` spans under ``root``, making it when missing."""
    data = root / f"spans-{n_spans}"
    if (data / "tables" / "spans").exists():
        return data
    base = 1_000_000
    if n_spans > base and n_spans % base == 0:
        replicate(ensure_store(root, base), data, n_spans // base)
        return data
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen import make_store

    t = time.perf_counter()
    made = make_store(data, n_spans, seed=0)
    print(f"made {made} spans in {time.perf_counter() - t:.1f}s under {data}", flush=True)
    return data


def replicate(src: Path, dst: Path, copies: int) -> None:
    """Copy a spans store ``copies`` times, each copy with its own trace ids (first hex digit replaced)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from tracedag.pipeline.store import parquet_files, table_dir, write_parquet_atomic

    for k in range(copies):
        for i, f in enumerate(parquet_files(src, "spans")):
            t = pq.read_table(f)
            ids = t.column("trace_id")
            new = pc.binary_join_element_wise(pa.scalar(f"{k:x}"), pc.utf8_slice_codeunits(ids, 1), "")
            t = t.set_column(t.schema.get_field_index("trace_id"), t.schema.field("trace_id"), new)
            write_parquet_atomic(t.cast(t.schema), table_dir(dst, "spans") / f"copy={k}", f"part-{i:05d}")
    print(f"replicated {src} x{copies} into {dst}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Measure scan and build at each size; print medians, ratio to the scan baseline, and ns per span."""
    ap = argparse.ArgumentParser(description="tracedag build benchmark")
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/tracedag-bench"))
    args = ap.parse_args(argv)
    print(f"{'spans':>9} {'traces':>7} {'scan s':>7} {'build s':>8} {'x scan':>7} {'cpu s':>7} {'us/span':>8} "
          f"{'RSS MB':>7} {'load':>5}")
    for n in args.sizes:
        data = ensure_store(args.dir, n)
        scans = [run_child("scan", data) for _ in range(args.runs)]
        builds = [run_child("build", data) for _ in range(args.runs)]
        scan = statistics.median(r["seconds"] for r in scans)
        build = statistics.median(r["seconds"] for r in builds)
        rss = statistics.median(r["rss_mb"] for r in builds)
        cpu = statistics.median(r["cpu"] for r in builds)
        spans = int(builds[0]["spans"])
        print(f"{spans:>9} {int(builds[0]['traces']):>7} {scan:>7.2f} {build:>8.2f} {build / scan:>7.1f} {cpu:>7.2f} "
              f"{build / spans * 1e6:>8.2f} {rss:>7.0f} {os.getloadavg()[0]:>5.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
