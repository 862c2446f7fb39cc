"""Benchmark (#31 traces by id): one trace's first view and an unknown id, on the same store laid out two ways.

On a bench store (``bench/queries.py`` makes one: ``/tmp/tracedag-bench-queries/spans-N``), two copies
of its build tables (``traces``, ``dag_nodes``, ``dag_edges``) are measured in the same run:

- *unsorted*: the rows in the order a build wrote them before #31, row groups of 64k rows;
- *sorted*: as ``build._write`` writes them now: sorted by trace id (``build.by_trace``), row groups of
  ``build.TRACE_ROW_GROUP`` rows, so DuckDB skips every row group whose statistics do not hold the id.

The other tables are hard links to the same files. For ``--traces`` traces picked at random, alternately
on both copies: ``tracedag show``'s reads (``dag.show.load_shown``: the trace, its nodes, its root cause
and path, on a connection of its own) and serve's first view of a trace (``serve.data.Store.trace_json``
on a warmed ``Store``: nothing of that trace cached); and ``--unknown`` unknown ids on the warmed Store.
Each figure is the median over the traces. The ``traces`` view's lookup of one id (connect included) is
timed alone too, beside the view before #31 (an unnest of an arg_max row: the filter never reached the scan).

    python bench/trace_by_id.py --data /tmp/tracedag-bench-queries/spans-1000000 --traces 9

With ``--before CHECKOUT`` (a checkout of the code to compare with, e.g. ``git worktree add /tmp/base
HEAD~3``) it instead times, on the one store given, the code of CHECKOUT against this checkout in the
same run (one child process each, ``bench/trace_by_id_child.py``, asked in alternating order): ``show``'s
first view, serve's first view (``/api/traces/{id}/view`` on a warm server, the page's first request;
``/api/traces/{id}`` on a store just opened), an unknown id, ``/metrics`` cold and a live poll (``root_causes``
on a connection of its own); medians of ``--runs``
runs, each run on traces not read before, and the ratios after / before.

    python bench/trace_by_id.py --data /tmp/store-1m --before /tmp/base --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq

from tracedag.pipeline.dag.build import TRACE_ROW_GROUP, by_trace
from tracedag.pipeline.dag.show import load_shown
from tracedag.pipeline.serve.data import Store
from tracedag.pipeline.store.views import connect

BUILD_TABLES = ("traces", "dag_nodes", "dag_edges")


def _tables_copy(src: Path, dst: Path, rewrite: Callable[[Path, Path], bool]) -> None:
    """``dst``: a copy of ``src`` whose files ``rewrite(file, out)`` wrote (it returns True), every other
    file hard-linked. Nothing is done when ``dst`` exists."""
    if dst.exists():
        return
    for f in src.rglob("*"):
        out = dst / f.relative_to(src)
        if f.is_dir():
            out.mkdir(parents=True, exist_ok=True)
            continue
        out.parent.mkdir(parents=True, exist_ok=True)
        if not rewrite(f, out):
            os.link(f, out)


def _table_of(f: Path, src: Path) -> str:
    """The table a file of ``src`` belongs to ("" when it is not a table file)."""
    parts = f.relative_to(src).parts
    return parts[1] if parts[0] == "tables" and f.suffix == ".parquet" else ""


def _copy(src: Path, dst: Path, sort: bool) -> None:
    """``dst``: ``src`` with its build tables rewritten (sorted or not), every other file hard-linked."""
    def rewrite(f: Path, out: Path) -> bool:
        if _table_of(f, src) not in BUILD_TABLES:
            return False
        rows = pq.read_table(f)
        meta = pq.read_schema(f).metadata
        rows = (by_trace(rows) if sort else rows).replace_schema_metadata(meta)
        pq.write_table(rows, out, compression="zstd", row_group_size=TRACE_ROW_GROUP if sort else 64 * 1024)
        return True

    _tables_copy(src, dst, rewrite)


def _seconds(fn: Callable[..., object], *args: object) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def _unknown(store: Store) -> None:
    try:
        store.trace_json(uuid.uuid4().hex)
    except Exception as e:  # the 404 of an unknown id is what is timed
        if type(e).__name__ != "NotFound":
            raise


OLD_TRACES_VIEW = "select unnest(arg_max(t, (t.built_unix_nano, t.build_id))) from traces_all t group by t.trace_id"
"""The ``traces`` view before #31: the filter on trace_id did not reach the scan of traces_all."""


def _lookup(data: Path, trace_id: str, view: str = "traces") -> None:
    con = connect(data)
    try:
        con.execute(f"create or replace view traces_before_31 as {OLD_TRACES_VIEW}")
        con.execute(f"select * from {view} where trace_id = ?", [trace_id]).fetchall()
    finally:
        con.close()


PACKAGES = {"collector": "collector", "pipeline": "pipeline", "queries": "queries", "schemas": "schemas",
            "instrument": "pipeline/instrument", "testing": "pipeline/testing"}
"""The ``tracedag`` import package's parts and where they live in a checkout (pyproject's package-dir)."""


def _shim(checkout: Path, where: Path) -> Path:
    """A directory to put first on ``PYTHONPATH`` so that ``import tracedag`` loads ``checkout``'s code."""
    pkg = where / "tracedag"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").touch()
    for name, sub in PACKAGES.items():
        if not (pkg / name).exists():
            (pkg / name).symlink_to(checkout.resolve() / sub)
    return where


def child_answer(proc: subprocess.Popen[str]) -> dict[str, float]:
    """The next line a benchmark's child process printed, as JSON (its figures); the child's exit ends the run."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise SystemExit(f"the child exited ({proc.wait()})")
    answer: dict[str, float] = json.loads(line)
    return answer


class _Child:
    """``bench/trace_by_id_child.py`` over ``data`` with the tracedag of ``pythonpath`` (None: this checkout's)."""

    def __init__(self, data: Path, pythonpath: Path | None) -> None:
        env = dict(os.environ)
        if pythonpath is not None:
            env["PYTHONPATH"] = str(pythonpath)
        script = Path(__file__).with_name("trace_by_id_child.py")
        self.proc = subprocess.Popen([sys.executable, str(script), str(data)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        self._line()  # ready: its warm Store is made

    def _line(self) -> dict[str, float]:
        return child_answer(self.proc)

    def ask(self, command: str) -> tuple[float, float]:
        """(wall seconds, CPU seconds) of ``command``."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        answer = self._line()
        return answer["seconds"], answer["cpu"]

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait()


def files_as_written_now(src: Path, dst: Path) -> Path:
    """``dst``: ``src`` with its table files rewritten with the writer options of now
    (``store.parquet.parquet_options``: since #31 a trace id Bloom filter per row group; spans as the
    converters write them), same rows and row groups; other files hard-linked. ``--before`` reads ``src``."""
    from tracedag.pipeline.store.parquet import parquet_options

    def rewrite(f: Path, out: Path) -> bool:
        table = _table_of(f, src)
        if not table:
            return False
        pf = pq.ParquetFile(f)
        options = parquet_options(pf.schema_arrow.empty_table(), fast=table == "spans")
        with pq.ParquetWriter(out, pf.schema_arrow, **options) as w:
            for g in range(pf.num_row_groups):
                w.write_table(pf.read_row_group(g))
        return True

    _tables_copy(src, dst, rewrite)
    return dst


READS = {"show first view": "show", "serve first view (/view, warm)": "view",
         "serve /api/traces/{id}, cold": "cold", "/api/traces/{id}, server just started": "fresh",
         "/api/traces/{id}, first start": "first",
         "unknown id": "unknown", "/metrics cold": "metrics",
         "/metrics, server restarted": "metrics_kept", "live poll (root_causes)": "poll",
         "live poll, first after a round": "poll_first"}


OTHER_TRACE = {"cold": 1, "fresh": 2, "first": 3}
"""The reads of a trace not read before in the run (each: another of the run's traces): the others read one."""


def before_after(data: Path, before: Path, runs: int, after: Path | None = None,
                 commands: tuple[str, ...] = (), same_store: bool = False) -> int:
    """Time ``READS`` (those whose command is in ``commands``; none given: all) with the code of ``before`` on
    ``data`` and of ``after`` (None: this checkout) on ``data`` with its spans files as written now, alternating,
    and print medians (``same_store``: ``after`` reads ``data`` too, to time the code alone)."""
    reads = {r: c for r, c in READS.items() if not commands or c in commands}
    stores = {"before": data,
              "after": data if same_store else files_as_written_now(data, data.with_name(data.name + "-after"))}
    con = connect(data)
    ids = [str(r[0]) for r in con.execute("select trace_id from traces order by trace_id").fetchall()]
    spans = con.execute("select count(*) from spans").fetchall()[0][0]
    con.close()
    picked = random.Random(31).sample(ids, runs * 4)
    with tempfile.TemporaryDirectory(prefix="bench-byid-") as tmp:
        shims = {k: None if c is None else _shim(c, Path(tmp) / k) for k, c in (("before", before), ("after", after))}
        children = {k: _Child(stores[k], shim) for k, shim in shims.items()}
        times: dict[str, dict[str, list[tuple[float, float]]]] = {k: {r: [] for r in reads} for k in children}
        try:
            for run in range(runs):
                order = list(children) if run % 2 == 0 else list(reversed(children))
                for label in order:
                    for read, command in reads.items():
                        tid = picked[4 * run + OTHER_TRACE.get(command, 0)]
                        times[label][read].append(children[label].ask(f"{command} {tid}"))
        finally:
            for c in children.values():
                c.close()
    print(f"{spans} spans, {len(ids)} traces, {runs} runs, load average {os.getloadavg()[0]:.1f}")
    print(f"{'read (median ms)':<34}{'before':>10}{'after':>10}{'ratio':>8}{'cpu before':>12}{'cpu after':>11}{'ratio':>8}")
    for read in reads:
        (b, bc), (a, ac) = (tuple(statistics.median(x[i] for x in times[k][read]) * 1000 for i in (0, 1))
                            for k in ("before", "after"))
        print(f"{read:<34}{b:>10.1f}{a:>10.1f}{a / b:>8.3f}{bc:>12.1f}{ac:>11.1f}{ac / max(bc, 1e-9):>8.3f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Copy the store both ways, time the reads of one trace on each, print medians and ratios
    (``--before``: time two code versions on one store instead)."""
    ap = argparse.ArgumentParser(description="#31 one trace by id: sorted build files vs unsorted")
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--traces", type=int, default=9)
    ap.add_argument("--unknown", type=int, default=50)
    ap.add_argument("--dir", type=Path, default=None, help="where the two copies go (default: beside --data)")
    ap.add_argument("--before", type=Path, default=None, help="a checkout of the code to compare with")
    ap.add_argument("--after", type=Path, default=None, help="with --before: the checkout to time (default: this one)")
    ap.add_argument("--runs", type=int, default=5, help="runs of each read (--before)")
    ap.add_argument("--reads", default="", help="--before: only these child commands, comma-separated (show,view,"
                    "cold,fresh,first,unknown,metrics,metrics_kept,poll,poll_first; default: all)")
    ap.add_argument("--same-store", action="store_true", help="--before: the code of now reads --data too (not a "
                    "copy with its files as written now): the ratios are the code's alone")
    args = ap.parse_args(argv)
    if args.before is not None:
        commands = tuple(c for c in args.reads.split(",") if c)
        return before_after(args.data, args.before, args.runs, args.after, commands, args.same_store)
    base = args.dir or args.data.parent
    stores = {"unsorted": base / f"{args.data.name}-unsorted", "sorted": base / f"{args.data.name}-sorted"}
    for label, path in stores.items():
        _copy(args.data, path, sort=label == "sorted")
    con = connect(args.data)
    ids = [str(r[0]) for r in con.execute("select trace_id from traces").fetchall()]
    spans = con.execute("select count(*) from spans").fetchall()[0][0]
    con.close()
    picked = random.Random(31).sample(ids, args.traces)
    servers = {label: Store(path) for label, path in stores.items()}
    for s in servers.values():
        s.trace_ids()  # warmed: its connection and id set are made
    times: dict[str, dict[str, list[float]]] = {k: {"show": [], "serve first view": [], "traces lookup": [],
                                                    "traces lookup, view before #31": [], "unknown id": []} for k in stores}
    for i, tid in enumerate(picked):
        for label in (list(stores) if i % 2 == 0 else list(reversed(stores))):
            t = times[label]
            t["show"].append(_seconds(load_shown, stores[label], tid))
            t["serve first view"].append(_seconds(servers[label].trace_json, tid))
            t["traces lookup"].append(_seconds(_lookup, stores[label], tid))
            t["traces lookup, view before #31"].append(
                _seconds(_lookup, stores[label], tid, "traces_before_31"))
    for label, store in servers.items():
        times[label]["unknown id"] = [_seconds(_unknown, store) for _ in range(args.unknown)]
    print(f"{spans} spans, {len(ids)} traces, {args.traces} traces, load average {os.getloadavg()[0]:.1f}")
    print(f"{'read':<32}{'unsorted ms':>14}{'sorted ms':>12}{'ratio':>8}")
    for what in times["sorted"]:
        before, after = (statistics.median(times[k][what]) * 1000 for k in ("unsorted", "sorted"))
        print(f"{what:<32}{before:>14.1f}{after:>12.1f}{after / before:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
