"""Benchmark: named queries as table macros (issue 28) against the same queries run by name.

Store: ``bench/gen.py`` spans, built, scored with synthetic scores (``bench/queries.py``'s
``ensure_store``; reused when it exists). Measured in the same run, medians of ``--runs`` runs:

- connect: ``views.connect`` (views + shared macros: what every connection pays, the baseline),
  the same plus one named-query macro (``create_query_macros(con, "root_causes")``), plus all of them
  (``tracedag sql --init``, ``connect(query_macros=True)``);
- each query by name (its .sql text with bound parameters, as ``tracedag query NAME``: the baseline)
  and as a macro (``select * from NAME(...)``, the macro made on that connection first, as
  ``tracedag query --sql`` does), both on a fresh 2-thread connection; the ratio is macro / name.

    python bench/query_macros.py --spans 200000 --runs 5
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from tracedag.pipeline.store.query_macros import create_query_macros  # noqa: E402
from tracedag.pipeline.store.querying import bind_params, query_doc  # noqa: E402
from tracedag.pipeline.store.views import connect  # noqa: E402
from tracedag.queries import load  # noqa: E402

_SPEC = importlib.util.spec_from_file_location("bench_named_queries", ROOT / "bench" / "queries.py")
assert _SPEC is not None and _SPEC.loader is not None
bench_queries = importlib.util.module_from_spec(_SPEC)  # bench/queries.py: makes the store
_SPEC.loader.exec_module(bench_queries)

CASES: list[tuple[str, dict[str, str], str]] = [
    ("failures", {}, "failures()"),
    ("root_causes", {}, "root_causes()"),
    ("root_causes", {"per": "conversation"}, "root_causes(per := 'conversation')"),
    ("propagation", {"per": "conversation"}, "propagation(per := 'conversation')"),
    ("trace_summary", {}, "trace_summary()"),
    ("step_stats", {}, "step_stats()"),
]


def _median(fn: Callable[[], object], runs: int) -> tuple[float, float]:
    """Median wall seconds and median CPU seconds of this process (all DuckDB threads).

    On a shared machine the wall time follows the load; the CPU time is what the work costs.
    """
    walls, cpus = [], []
    for _ in range(runs):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return statistics.median(walls), statistics.median(cpus)


def _connect_only(data: Path, macros: str | None) -> Callable[[], object]:
    def run() -> object:
        con = connect(data)
        try:
            return create_query_macros(con, macros) if macros != "all" else create_query_macros(con)
        finally:
            con.close()

    return run if macros is not None else lambda: connect(data).close()


def _by_name(data: Path, name: str, params: dict[str, str]) -> Callable[[], object]:
    sql, values = load(name), bind_params(query_doc(name), params)

    def run() -> object:
        con = connect(data, threads=2)
        try:
            return len(con.execute(sql, values).fetchall())
        finally:
            con.close()

    return run


def _as_macro(data: Path, call: str) -> Callable[[], object]:
    sql = f"select * from {call}"

    def run() -> object:
        con = connect(data, threads=2)
        try:
            create_query_macros(con, sql)
            return len(con.execute(sql).fetchall())
        finally:
            con.close()

    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="issue-28 query macros benchmark")
    ap.add_argument("--spans", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/tracedag-bench-macros"))
    args = ap.parse_args(argv)
    data = args.dir / f"s{args.spans}"
    bench_queries.ensure_store(data, args.spans, synthetic=True)
    console = Console()

    connects = Table("connection", "wall s", "cpu s", "cpu x baseline", title=f"connect (medians of {args.runs})")
    base = _median(_connect_only(data, None), args.runs)
    for label, macros in [("views + shared macros (baseline)", None), ("+ root_causes macro", "root_causes"),
                          ("+ every named-query macro", "all")]:
        wall, cpu = base if macros is None else _median(_connect_only(data, macros), args.runs)
        connects.add_row(label, f"{wall:.3f}", f"{cpu:.3f}", f"{cpu / base[1]:.2f}")
    console.print(connects)

    results = Table("query", "rows", "by name wall/cpu s", "as macro wall/cpu s", "cpu macro / name",
                    title=f"{data} (medians of {args.runs}, 2 DuckDB threads)")
    for name, params, call in CASES:
        by_name = _median(_by_name(data, name, params), args.runs)
        as_macro = _median(_as_macro(data, call), args.runs)
        rows = _by_name(data, name, params)()
        assert rows == _as_macro(data, call)(), call  # the same rows, or the comparison means nothing
        results.add_row(call, str(rows), f"{by_name[0]:.2f} / {by_name[1]:.2f}",
                        f"{as_macro[0]:.2f} / {as_macro[1]:.2f}", f"{as_macro[1] / by_name[1]:.2f}")
    console.print(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
