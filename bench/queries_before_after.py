"""Named queries of a git revision (default HEAD) against this checkout's, on the same store, same run.

Reads the ``queries/*.sql`` of ``--before`` with ``git show`` (nothing is checked out), creates its
``_*.sql`` macros on a second connection, and times each named query with both SQL texts on the
same bench store (made by ``bench/queries.py``), alternating, on ``--threads`` DuckDB threads.
Prints the median CPU and wall seconds of ``--runs`` runs and the ratio after / before. Parameters
(``name:key=value;key=value``) the old text lacks, or whose value its header does not name (a new
``per=conversation``, say), fall back to the old defaults for the old text.

    python bench/queries.py --sizes 250000 --runs 1 --dir /tmp/tracedag-bench-queries
    python bench/queries_before_after.py /tmp/tracedag-bench-queries/spans-250000 \\
        failures propagation root_causes root_causes:per=step workflow_scores trace_summary
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from pathlib import Path

import duckdb
from rich.console import Console
from rich.table import Table

from tracedag import queries
from tracedag.pipeline.store.querying import bind_params, query_doc
from tracedag.pipeline.store.views import connect

ROOT = Path(__file__).resolve().parents[1]


def _old_sql(rev: str, name: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:queries/{name}.sql"], check=True,
                          capture_output=True, text=True).stdout


def _time(con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, object]) -> tuple[float, float]:
    c0, w0 = time.process_time(), time.perf_counter()
    con.execute(sql, params).fetchall()
    return time.process_time() - c0, time.perf_counter() - w0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", type=Path)
    ap.add_argument("queries", nargs="+", help="name or name:key=value;key=value")
    ap.add_argument("--before", default="HEAD")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    new, old = connect(args.data, threads=args.threads), connect(args.data, threads=args.threads)
    for macro in queries.macro_files():
        old.execute(_old_sql(args.before, macro))
    table = Table(title=f"{args.data}: median of {args.runs}, {args.threads} threads, before = {args.before}")
    for col in ("query", "before cpu s", "after cpu s", "after / before", "before wall s", "after wall s"):
        table.add_column(col, justify="left" if col == "query" else "right", no_wrap=col == "query")
    for spec in args.queries:
        name, _, extra = spec.partition(":")
        given = dict(kv.split("=", 1) for kv in extra.split(";") if kv)
        params = bind_params(query_doc(name), given)
        old_text = _old_sql(args.before, name)
        # a parameter the old text lacks, or a value its header does not list, falls back to its default
        old_doc = {p.name: p for p in (queries._param(line) for line in queries.header_lines(old_text)) if p}
        kept = {k: v for k, v in given.items() if k in old_doc and (not old_doc[k].choices or v in old_doc[k].choices)}
        old_params = bind_params(query_doc(name), kept)
        old_params = {k: v for k, v in old_params.items() if f"${k}" in old_text}
        before, after = [], []
        for _ in range(args.runs):
            before.append(_time(old, old_text, old_params))
            after.append(_time(new, queries.load(name), params))
        bc, ac = statistics.median(c for c, _ in before), statistics.median(c for c, _ in after)
        table.add_row(spec, f"{bc:.3f}", f"{ac:.3f}", f"{ac / bc:.2f}",
                      f"{statistics.median(w for _, w in before):.3f}", f"{statistics.median(w for _, w in after):.3f}")
    Console().print(table)


if __name__ == "__main__":
    main()
