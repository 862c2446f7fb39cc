"""Benchmark of ``tracedag build`` (DAG reconstruction) at several store sizes.

For each size a store is made once with ``bench/gen.py`` (``make_store``; sizes above 1M spans are
made by copying the 1M store with fresh trace ids, which is much faster than generating), then
each measured run is a fresh process:

- ``scan`` (baseline): read the build's input columns of every span from Parquet (the I/O floor);
- ``build``: ``build_store(data, idle_seconds=0, full=True)``, everything rebuilt;
- ``naive`` (sizes up to ``--naive-max``): the obvious design for comparison, one networkx graph
  per trace with pairwise sibling comparison, transitive reduction and topological sort (no
  repair, no loops/branches, no output written), so it does less than ``build``.

Wall time inside the child (interpreter start and imports excluded), CPU time (user+sys, imports
included, about 1 s) and peak RSS (``wait4`` rusage of the child) are medians over
``--runs``; ``load`` is the 1-minute load average when the size finished (the machine is shared:
CPU seconds are the figure that does not depend on the neighbours).

    python bench/build.py --sizes 100000 1000000 --runs 3 --dir /tmp/tracedag-bench

``--gc-builds K`` also measures what garbage collection of superseded builds buys: on a copy of the
spans of the largest size (hard links), K full builds with the collection turned off, then the view
cost (``select count(*)`` of ``dag_nodes``, ``dag_edges``, ``traces``; median of ``--runs`` fresh
connections) before and after one ``collect`` (its time is reported too). ``--gc-incremental M``
then runs M incremental builds (50 traces re-sent each) with compaction off and measures the views
before and after one forced compaction.

    python bench/build.py --sizes 1000000 --runs 3 --gc-builds 8
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
from tracedag.pipeline.store.files import parquet_files
from tracedag.schemas.spans import SPANS_V1
t = time.perf_counter()
files = [str(f) for f in parquet_files(Path(sys.argv[1]), "spans")]
n = ds.dataset(files, schema=SPANS_V1, format="parquet").to_table(columns=INPUT_COLUMNS).num_rows
print(json.dumps({"seconds": time.perf_counter() - t, "spans": n}))
""",
    # the obvious design, for comparison: one networkx graph per trace, siblings compared pairwise
    "naive": """
import json, sys, time
from collections import defaultdict
from pathlib import Path
import networkx as nx
import pyarrow.dataset as ds
from tracedag.pipeline.store.files import parquet_files
from tracedag.schemas.spans import SPANS_V1
t = time.perf_counter()
files = [str(f) for f in parquet_files(Path(sys.argv[1]), "spans")]
cols = ["trace_id", "span_id", "parent_span_id", "start_time_unix_nano", "end_time_unix_nano"]
rows = ds.dataset(files, schema=SPANS_V1, format="parquet").to_table(columns=cols).to_pylist()
by_trace = defaultdict(list)
for r in rows:
    by_trace[r["trace_id"]].append(r)
edges = 0
for spans in by_trace.values():
    g = nx.DiGraph()
    kids = defaultdict(list)
    for r in spans:
        g.add_node(r["span_id"])
        kids[r["parent_span_id"]].append(r)
        if r["parent_span_id"]:
            g.add_edge(r["span_id"], r["parent_span_id"])
    for sib in kids.values():
        for a in sib:
            for b in sib:
                if a["start_time_unix_nano"] < b["start_time_unix_nano"] and \
                        a["end_time_unix_nano"] <= b["start_time_unix_nano"] + 1_000_000:
                    g.add_edge(a["span_id"], b["span_id"])
    if nx.is_directed_acyclic_graph(g):
        g = nx.transitive_reduction(g)
        order = list(nx.topological_sort(g))
    edges += g.number_of_edges()
print(json.dumps({"seconds": time.perf_counter() - t, "spans": len(rows), "edges": edges}))
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
    result: dict[str, float] = json.loads(out)
    result["wall"] = time.perf_counter() - t
    result["rss_mb"] = usage.ru_maxrss / 1024
    result["cpu"] = usage.ru_utime + usage.ru_stime
    return result


def _median_runs(kind: str, data: Path, runs: int) -> dict[str, float]:
    """Median of each figure over ``runs`` fresh-process runs."""
    results = [run_child(kind, data) for _ in range(runs)]
    out: dict[str, float] = {k: statistics.median(float(r[k]) for r in results) for k in ("seconds", "cpu", "rss_mb")}
    out.update({k: float(results[0][k]) for k in ("spans", "traces") if k in results[0]})
    return out


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

    from tracedag.pipeline.store.files import parquet_files
    from tracedag.pipeline.store.parquet import write_parquet_atomic
    from tracedag.schemas.layout import table_dir

    for k in range(copies):
        for i, f in enumerate(parquet_files(src, "spans")):
            t = pq.read_table(f)
            ids = t.column("trace_id")
            new = pc.binary_join_element_wise(pa.scalar(f"{k:x}"), pc.utf8_slice_codeunits(ids, 1), "")
            t = t.set_column(t.schema.get_field_index("trace_id"), t.schema.field("trace_id"), new)
            write_parquet_atomic(t.cast(t.schema), table_dir(dst, "spans") / f"copy={k}", f"part-{i:05d}")
    print(f"replicated {src} x{copies} into {dst}", flush=True)


VIEW_SQL = {name: f"select count(*) from {name}" for name in ("dag_nodes", "dag_edges", "traces")}


def view_costs(data: Path, runs: int) -> dict[str, tuple[float, int, int]]:
    """Per view: (median seconds of ``count(*)``, live rows, rows of the raw ``*_all`` view)."""
    from tracedag.pipeline.store.views import connect

    out = {}
    for name, sql in VIEW_SQL.items():
        times, n = [], 0
        for _ in range(runs):
            con = connect(data)
            t = time.perf_counter()
            n = con.sql(sql).fetchall()[0][0]
            times.append(time.perf_counter() - t)
            con.close()
        con = connect(data)
        raw = con.sql(f"select count(*) from {name}_all").fetchall()[0][0]
        con.close()
        out[name] = (statistics.median(times), int(n), int(raw))
    return out


def gc_bench(root: Path, n_spans: int, builds: int, runs: int) -> None:
    """K full builds without collection, then the view cost before and after one collection."""
    from tracedag.pipeline.dag import build_store
    from tracedag.pipeline.store.files import parquet_files
    from tracedag.pipeline.store.gc import GcSettings
    from tracedag.pipeline.store.swap import collect

    src, data = ensure_store(root, n_spans), root / f"gc-{n_spans}"
    if data.exists():
        import shutil

        shutil.rmtree(data)
    for f in parquet_files(src, "spans"):
        dst = data / f.relative_to(src)
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.link(f, dst)
    secs = [build_store(data, idle_seconds=0, full=True, gc=GcSettings(enabled=False)).seconds for _ in range(builds)]
    print(f"{builds} full builds without collection: median {statistics.median(secs):.2f} s", flush=True)
    before = view_costs(data, runs)
    t = time.perf_counter()
    stats = collect(data)
    gc_s = time.perf_counter() - t
    after = view_costs(data, runs)
    print(f"collect: {gc_s:.2f} s, files deleted {stats.deleted}, rewritten {stats.rewritten}")
    print(f"{'view':>10} {'rows':>9} {'raw before':>11} {'raw after':>10} {'before s':>9} {'after s':>8} {'ratio':>6}")
    for name in VIEW_SQL:
        (b, n, rb), (a, n2, ra) = before[name], after[name]
        assert n == n2, f"{name}: {n} rows before, {n2} after"
        print(f"{name:>10} {n:>9} {rb:>11} {ra:>10} {b:>9.3f} {a:>8.3f} {b / a:>6.1f}", flush=True)


def late_spans(data: Path, k: int, per_build: int) -> None:
    """Re-send the spans of ``per_build`` traces (slice ``k``) later: they are rebuilt incrementally."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from tracedag.pipeline.store.files import parquet_files
    from tracedag.pipeline.store.parquet import write_parquet_atomic
    from tracedag.schemas.layout import table_dir

    files = [f for f in parquet_files(data, "spans") if "late" not in f.parts]
    t = pq.read_table(max(files, key=lambda p: p.stat().st_size))
    ids = pc.unique(t.column("trace_id").cast(pa.string())).to_pylist()[k * per_build:(k + 1) * per_build]
    sub = t.filter(pc.is_in(t.column("trace_id").cast(pa.string()), value_set=pa.array(ids, pa.string())))
    received = pa.array([time.time_ns() - 10**9] * sub.num_rows, pa.int64())
    sub = sub.set_column(sub.schema.get_field_index("received_unix_nano"), "received_unix_nano", received)
    write_parquet_atomic(sub.cast(t.schema), table_dir(data, "spans") / "late")


def incremental_bench(root: Path, n_spans: int, builds: int, runs: int) -> None:
    """``builds`` incremental builds of 50 traces each without compaction, then one forced compaction."""
    from tracedag.pipeline.dag import build_store
    from tracedag.pipeline.store.files import parquet_files
    from tracedag.pipeline.store.gc import GcSettings
    from tracedag.pipeline.store.swap import collect

    data = root / f"gc-{n_spans}"
    build_store(data, idle_seconds=0, full=True)
    cfg = GcSettings(max_small_files=10**9)
    stats = []
    for k in range(builds):
        late_spans(data, k, 50)
        stats.append(build_store(data, idle_seconds=0, gc=cfg))
    gcs = [s.gc.seconds for s in stats if s.gc is not None]
    print(f"{builds} incremental builds of {stats[0].traces_built} traces: median {statistics.median(s.seconds for s in stats):.2f} s,"
          f" of which collection {statistics.median(gcs):.2f} s", flush=True)
    files = {t: len(parquet_files(data, t)) for t in VIEW_SQL}
    before = view_costs(data, runs)
    t = time.perf_counter()
    done = collect(data, compact=True)
    took = time.perf_counter() - t
    after = view_costs(data, runs)
    print(f"compaction: {took:.2f} s, files {files} -> "
          f"{ {t: len(parquet_files(data, t)) for t in VIEW_SQL} }, merged {done.merged}")
    for name in VIEW_SQL:
        (b, n, rb), (a, n2, ra) = before[name], after[name]
        assert n == n2, f"{name}: {n} rows before, {n2} after"
        print(f"{name:>10} {n:>9} {rb:>11} {ra:>10} {b:>9.3f} {a:>8.3f} {b / a:>6.1f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Measure scan, naive and build at each size; print medians, the naive/build CPU ratio and CPU us per span."""
    ap = argparse.ArgumentParser(description="tracedag build benchmark")
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/tracedag-bench"))
    ap.add_argument("--naive-max", type=int, default=200_000, help="largest size at which to run the naive baseline")
    ap.add_argument("--gc-builds", type=int, default=0, help="also measure view cost after this many builds, before/after GC")
    ap.add_argument("--gc-incremental", type=int, default=0,
                    help="then this many incremental builds, and the view cost before/after one compaction")
    args = ap.parse_args(argv)
    print(f"{'spans':>9} {'traces':>7} {'scan s':>7} {'naive s':>8} {'build s':>8} {'naive cpu':>9} {'build cpu':>9} "
          f"{'cpu ratio':>9} {'cpu us/span':>11} {'RSS MB':>7} {'load':>5}")
    for n in args.sizes:
        data = ensure_store(args.dir, n)
        med = {k: _median_runs(k, data, args.runs) for k in ("scan", "naive", "build") if k != "naive" or n <= args.naive_max}
        b, nv = med["build"], med.get("naive", {"seconds": float("nan"), "cpu": float("nan")})
        print(f"{int(b['spans']):>9} {int(b['traces']):>7} {med['scan']['seconds']:>7.2f} {nv['seconds']:>8.2f} "
              f"{b['seconds']:>8.2f} {nv['cpu']:>9.2f} {b['cpu']:>9.2f} {nv['cpu'] / b['cpu']:>9.1f} "
              f"{b['cpu'] / b['spans'] * 1e6:>11.2f} {b['rss_mb']:>7.0f} {os.getloadavg()[0]:>5.1f}", flush=True)
    if args.gc_builds:
        gc_bench(args.dir, max(args.sizes), args.gc_builds, args.runs)
    if args.gc_builds and args.gc_incremental:
        incremental_bench(args.dir, max(args.sizes), args.gc_incremental, args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
