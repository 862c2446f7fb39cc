"""Benchmark: every named query of issue 6 on generated bench stores, on 2 DuckDB threads.

Stores: the largest is ``bench/gen.py`` spans (``make_store``), DAGs from ``tracedag.pipeline.dag.build_store``,
step scores from ``tracedag.pipeline.score.score_store`` (rules, no judge). When scoring fails or
``--synthetic-scores`` is given, step scores are derived in SQL from the nodes instead: status
ERROR -> 1.0 (rule), about 4% of the other steps -> 2.0 (rule), an extra judge row on LLM steps
(about 3% -> 2.0, else 4.0) and a human row on about 0.2% of the steps, so the queries meet several
rows per step, human overrides, retries and propagated failures. Smaller sizes are samples of the
largest store's traces (every table), so the growth figures compare like with like.

Baseline, measured in the same run: a full scan of the ``dag_nodes`` view (count and sum of
durations), i.e. the cheapest query over the same files. Prints the median of ``--runs`` runs of
each query (wall time, and the CPU time of the process over all DuckDB threads: on a shared machine
the wall time depends on the load, cpu/2 is what 2 free cores would need at best), its ratio to the
baseline, and ``root_causes`` at every store size (linearity). Each answer is taken as Arrow (as
``tracedag query`` and serve take it; before #31 the bench fetched Python tuples, which cost more
than reading the stored rows).

Issue 31: the queries ``tracedag score`` materializes (``store.materialized.SPECS``) are timed twice on
the same store in the same run: ``sql`` runs their SQL text (the reference, as before), ``stored`` reads
the rows materialized at score time, as ``tracedag query`` does when their parameters are the
materialized ones (a store scored before issue 31 is materialized first, its time printed).
``--sql-only`` leaves the stored reads out, ``--stored-only`` the SQL rows. A stored read is timed as a
``tracedag query`` process pays it: ``run_named`` on a connection of its own, with the store's freshness
checked again (not remembered from the previous run).

    python bench/queries.py --sizes 250000,500000,1000000 --runs 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import duckdb
import pyarrow as pa
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import gen  # noqa: E402

from tracedag.pipeline.store.files import parquet_files  # noqa: E402
from tracedag.pipeline.store.parquet import write_parquet_atomic  # noqa: E402
from tracedag.pipeline.store.querying import bind_params, query_doc  # noqa: E402
from tracedag.pipeline.store.views import connect  # noqa: E402
from tracedag.queries import load  # noqa: E402
from tracedag.schemas.layout import table_dir  # noqa: E402
from tracedag.schemas.tables import STEP_SCORES_V1  # noqa: E402

QUERIES = ["failures", "propagation", "root_causes", "amplification", "workflow_scores", "step_stats",
           "trace_summary"]
VARIANTS: dict[str, dict[str, str]] = {
    "root_causes per=step": {"per": "step"},
    "root_causes weighted": {"strategy": "weighted"},
    "root_causes full_path_min": {"strategy": "full_path_min"},
}
BASELINE = "select count(*), sum(duration_ns) from dag_nodes"
SYNTHETIC_SCORES = """
select trace_id, span_id, build_id, 'status' as metric,
       case when status_code = 2 then 1.0 when hash(span_id || 'r') % 100 < 4 then 2.0 else 5.0 end as score,
       null as label, 'rule' as source, 'synthetic' as rule_name, null as judge_model, null as rubric_version,
       null as explanation,
       case when status_code = 2 then 'tool_execution' when hash(span_id || 'r') % 100 < 4 then 'planning' end
           as taxonomy_l1,
       null as taxonomy_l2, null as taxonomy_l3, 0 as scored_unix_nano
from dag_nodes
union all
select trace_id, span_id, build_id, 'faithfulness', case when hash(span_id || 'j') % 100 < 3 then 2.0 else 4.0 end,
       null, 'judge', null, 'bench-judge', 'v1', null,
       case when hash(span_id || 'j') % 100 < 3 then 'generation' end, null, null, 0
from dag_nodes where step_type = 'llm'
union all
select trace_id, span_id, null, 'correctness', 5.0, null, 'human', null, null, null, null, null, null, null, 0
from dag_nodes where hash(span_id || 'h') % 1000 < 2
"""


def _log(msg: str) -> None:
    Console(stderr=True).print(f"[dim]{msg}[/dim]")


def synthetic_scores(data: Path) -> int:
    """Write step scores derived from the nodes (see the module docstring); return the row count."""
    con = connect(data)
    try:
        rel = con.sql(SYNTHETIC_SCORES)
        table = getattr(rel, "to_arrow_table", None) or rel.arrow
        rows: pa.Table = table()
    finally:
        con.close()
    rows = rows.cast(STEP_SCORES_V1)
    write_parquet_atomic(rows, table_dir(data, "step_scores"), "bench-synthetic", row_group_size=256 * 1024)
    return rows.num_rows


def ensure_store(data: Path, n_spans: int, synthetic: bool) -> None:
    """Generate, build and score a bench store of about ``n_spans`` spans unless it already exists."""
    from tracedag.pipeline.dag.build import build_store

    if not parquet_files(data, "spans"):
        t0 = time.perf_counter()
        _log(f"{data}: {gen.make_store(data, n_spans)} spans in {time.perf_counter() - t0:.0f}s")
    if not parquet_files(data, "traces"):
        _log(f"{data}: built in {build_store(data, idle_seconds=0, full=True).seconds}s")
    if parquet_files(data, "step_scores"):
        return
    if not synthetic:
        try:
            from tracedag.pipeline.score.runner import score_store

            score_store(data)
            return
        except Exception as e:  # the scorer is another area; fall back so the queries can be measured
            _log(f"score_store failed ({type(e).__name__}: {str(e).splitlines()[0]}); synthetic scores")
    _log(f"{data}: {synthetic_scores(data)} synthetic score rows")


def derive_store(src: Path, dst: Path, fraction: float) -> None:
    """Fill ``dst`` with the traces of ``src`` whose id hashes into the first ``fraction`` (all tables)."""
    from tracedag.pipeline.store.views import SCHEMAS

    if parquet_files(dst, "traces"):
        return
    con = connect(src)
    try:
        for table in ("spans", "step_scores", "dag_nodes", "dag_edges", "traces"):
            source = f"{table}_all" if table != "spans" else "spans"
            target = table_dir(dst, table)
            target.mkdir(parents=True, exist_ok=True)
            tmp = target / "derived.parquet.tmp"
            version = (SCHEMAS[table].metadata or {})[b"tracedag.schema"].decode()
            con.execute(
                f"copy (select * from {source} where hash(trace_id) % 1000 < {int(fraction * 1000)}) "
                f"to '{tmp}' (format parquet, compression zstd, kv_metadata {{'tracedag.schema': '{version}'}})"
            )
            tmp.replace(target / "derived.parquet")
    finally:
        con.close()
    _log(f"{dst}: derived {fraction:.0%} of the traces of {src}")


def _median(fn: Callable[[], int], runs: int) -> tuple[float, float, int]:
    """Median wall seconds, median CPU seconds of this process (all DuckDB threads) and the row count."""
    walls, cpus, rows = [], [], 0
    for _ in range(runs):
        t0, c0 = time.perf_counter(), time.process_time()
        rows = fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return statistics.median(walls), statistics.median(cpus), rows


def _rows(con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, object]) -> int:
    """Run ``sql`` and take its answer as Arrow, as ``tracedag query`` and serve do; return its row count."""
    rel = con.sql(sql, params=params or None)
    table = getattr(rel, "to_arrow_table", None) or rel.arrow
    return int(table().num_rows)


def _runner(data: Path, sql: str, params: dict[str, object]) -> Callable[[], int]:
    def run() -> int:
        # the shared macros are bound only for SQL that calls them (as run_named does): a scan needs none
        con = connect(data, threads=2, shared_macros=sql != BASELINE)
        try:
            return _rows(con, sql, params)
        finally:
            con.close()

    return run


def _named(data: Path, label: str) -> Callable[[], int]:
    name = label.split()[0]
    given = VARIANTS.get(label, {})
    return _runner(data, load(name), bind_params(query_doc(name), given))


def _stored(data: Path, label: str) -> Callable[[], int]:
    """Read ``label``'s materialized rows as ``tracedag query`` does in a process of its own: ``run_named``
    (its connection, the freshness check not remembered from an earlier run, the stored rows)."""
    from tracedag.pipeline.store import freshness
    from tracedag.pipeline.store.querying import run_named

    name = label.split()[0]
    con = connect(data)
    try:
        if freshness.named_statement(con, data, name, bind_params(query_doc(name), VARIANTS.get(label, {}))) is None:
            raise SystemExit(f"{label}: the store has no current materialized rows")
    finally:
        con.close()

    def run() -> int:
        freshness._FRESH.clear()
        return int(run_named(data, name, VARIANTS.get(label, {}), threads=2).num_rows)

    return run


def stored_labels(labels: list[str]) -> list[str]:
    """The labels whose parameters the materialized rows answer."""
    from tracedag.pipeline.store.materialized import matches

    return [x for x in labels if matches(x.split()[0], bind_params(query_doc(x.split()[0]), VARIANTS.get(x, {})))]


def ensure_materialized(data: Path) -> None:
    """Materialize a store whose rows are not current (scored before issue 31, or by other SQL): one
    round (full when the SQL or the labels changed), and say what it cost."""
    from tracedag.pipeline.score.materialize import materialize
    from tracedag.pipeline.store.freshness import fresh

    con = connect(data)
    try:
        current = fresh(con, data)
    finally:
        con.close()
    if not current:
        stats = materialize(data, [])
        _log(f"{data}: materialized {stats.traces} traces in {stats.seconds}s ({stats.rows})")


def measure(data: Path, labels: list[str], runs: int, stored: bool = False,
            sql: bool = True) -> dict[str, tuple[float, float, int]]:
    """Median seconds and row count of each query label, plus the baseline under ``"baseline"``;
    with ``stored``, each materialized label again as ``<label> (stored)``; ``sql`` False: only those."""
    out = {"baseline": _median(_runner(data, BASELINE, {}), runs)}
    for label in labels if sql else []:
        out[label] = _median(_named(data, label), runs)
    for label in stored_labels(labels) if stored else []:
        out[f"{label} (stored)"] = _median(_stored(data, label), runs)
    return out


def _store_figures(data: Path) -> tuple[int, int, int]:
    con = connect(data)
    try:
        row = con.execute(
            "select (select count(*) from spans), (select count(*) from traces), "
            "(select count(*) from step_scores where score <= 2)"
        ).fetchone()
    finally:
        con.close()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


def main(argv: list[str] | None = None) -> int:
    """Build the stores, time the queries, print the tables."""
    ap = argparse.ArgumentParser(description="issue-6 named queries benchmark")
    ap.add_argument("--sizes", default="250000,500000,1000000", help="store sizes in spans, comma-separated")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/tracedag-bench-queries"))
    ap.add_argument("--synthetic-scores", action="store_true", help="do not run score_store")
    ap.add_argument("--sql-only", action="store_true", help="do not time the reads of materialized rows")
    ap.add_argument("--stored-only", action="store_true", help="time the reads of materialized rows and the baseline only")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    stores = {n: args.dir / f"spans-{n}" for n in sizes}
    largest = max(sizes)
    ensure_store(stores[largest], largest, args.synthetic_scores)
    for n, data in stores.items():
        if n != largest:  # smaller stores: a sample of the largest one's traces (all tables)
            derive_store(stores[largest], data, n / largest)
    console = Console()
    spans, traces, failed = _store_figures(stores[largest])
    if not args.sql_only:
        ensure_materialized(stores[largest])
    result = measure(stores[largest], QUERIES + list(VARIANTS), args.runs, stored=not args.sql_only,
                     sql=not args.stored_only)
    base = result["baseline"][0]
    table = Table(title=f"{spans} spans, {traces} traces, {failed} failing score rows, 2 threads, "
                        f"median of {args.runs}; load average {os.getloadavg()[0]:.1f}")
    for col in ("query", "wall s", "x baseline", "cpu s", "cpu s / 2", "rows"):
        table.add_column(col, justify="left" if col == "query" else "right")
    for label, (secs, cpu, rows) in result.items():
        table.add_row(label, f"{secs:.3f}", f"{secs / base:.1f}", f"{cpu:.3f}", f"{cpu / 2:.3f}", str(rows))
    console.print(table)
    if args.stored_only:
        return 0
    growth = Table(title="root_causes (greedy, per trace) by store size")
    for col in ("spans", "traces", "wall s", "cpu s", "baseline wall s", "cpu s per 1M spans"):
        growth.add_column(col, justify="right")
    for n in sizes:
        m = measure(stores[n], ["root_causes"], args.runs)
        s, t, _ = _store_figures(stores[n])
        wall, cpu, _rows = m["root_causes"]
        growth.add_row(str(s), str(t), f"{wall:.3f}", f"{cpu:.3f}", f"{m['baseline'][0]:.3f}", f"{cpu / s * 1e6:.3f}")
    console.print(growth)
    return 0


if __name__ == "__main__":
    sys.exit(main())
