"""Benchmark of ``score_store`` without a judge (rules + evaluations), beside same-run baselines.

Builds a store with ``bench/gen.py`` (about ``--spans`` spans) and ``build_store``, adds
``--evals`` evaluation results per 100 spans (seeded: 0-1 scores, verdict labels, 1-5
annotations, an inverted metric, labels no mapping knows, re-evaluations, results without a
target span), then, in each of ``--runs`` runs, times:

- baseline, the plain scan: the rule inputs of every step (``inputs.FACTS_CORE_SQL``) read into
  Arrow, the floor of any rule pass that reads them with DuckDB;
- baseline, the per-step reference: ``rules.score_step`` on every step, one at a time
  (``reference.reference_rows``; rows built, not written), the path score_store replaced;
- ``score_store`` on the store without ``tables/step_scores``: every step (rules and
  evaluations) scored and written;
- ``score_store`` again right after, with nothing new: what the live collector pays per call.

Each line shows the medians over the runs of its wall seconds and of the process's CPU seconds
(DuckDB's threads and the background writer included), spans/s (the store's spans over those
medians) and its median wall time over score_store's.

    python bench/score.py --spans 300000 --runs 5 --data /tmp/bench-score
"""

from __future__ import annotations

import argparse
import random
import resource
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gen

from tracedag.pipeline.dag import build_store
from tracedag.pipeline.score import inputs, score_store
from tracedag.pipeline.score.reference import reference_rows
from tracedag.pipeline.score.rows import to_table
from tracedag.pipeline.store import files as store
from tracedag.pipeline.store.parquet import write_parquet_atomic
from tracedag.pipeline.store.views import connect
from tracedag.schemas.layout import table_dir
from tracedag.schemas.tables import EVALUATIONS_V1


@dataclass
class Timing:
    """Medians of one measured step over the runs."""

    wall: float
    cpu: float


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _timed(fn: Callable[[], object]) -> tuple[float, float]:
    w, c = time.perf_counter(), _cpu()
    fn()
    return time.perf_counter() - w, _cpu() - c


def _median(samples: list[tuple[float, float]]) -> Timing:
    return Timing(statistics.median(s[0] for s in samples), statistics.median(s[1] for s in samples))


# ---- the store --------------------------------------------------------------------------------

_METRICS = [  # (name, value maker, label maker, source kind)
    ("relevance", lambda r: round(r.random(), 3), lambda r: None, "gen_ai.evaluation.result"),
    ("faithfulness", lambda r: None, lambda r: r.choice(["pass", "pass", "pass", "fail", "partial"]),
     "gen_ai.evaluation.result"),
    ("toxicity", lambda r: round(r.random() * 0.3, 3), lambda r: None, "openinference.evaluation"),
    ("helpfulness", lambda r: float(r.randint(1, 5)), lambda r: r.choice([None, "good", "bad"]),
     "openinference.annotation"),
    ("format_json", lambda r: None, lambda r: r.choice(["valid", "invalid", "blue"]), "gen_ai.evaluation.result"),
]


def _evaluation(rng: random.Random, trace_id: str, span_id: str | None, t: int) -> dict[str, object]:
    name, value, label, kind = rng.choice(_METRICS)
    return {"trace_id": trace_id, "span_id": span_id, "source_span_id": span_id, "source_kind": kind,
            "name": name, "score_value": value(rng), "label": label(rng),
            "explanation": rng.choice([None, None, "the answer cites the retrieved page", "misses the order id"]),
            "evaluator": rng.choice([None, "ragas", "phoenix"]), "time_unix_nano": t, "received_unix_nano": t}


def add_evaluations(data: Path, per_100_spans: int, seed: int = 0) -> int:
    """Write about ``per_100_spans`` evaluation results per 100 spans on LLM and tool spans; return how many."""
    con = connect(data)
    try:
        keys = con.sql("select trace_id, span_id from spans where step_type in ('llm', 'tool') "
                       "order by trace_id, span_id").fetchall()
        total = con.sql("select count(*) from spans").fetchall()[0][0]
    finally:
        con.close()
    rng = random.Random(seed)
    rows = []
    for i, (trace_id, span_id) in enumerate(rng.sample(keys, min(len(keys), total * per_100_spans // 100))):
        rows.append(_evaluation(rng, trace_id, None if i % 50 == 0 else span_id, 1_000 + i))
        if i % 20 == 0:  # a re-evaluation: the later result wins
            rows.append({**rows[-1], "score_value": None, "label": "fail", "time_unix_nano": 10_000_000 + i})
    if rows:
        write_parquet_atomic(pa.Table.from_pylist(rows, schema=EVALUATIONS_V1), table_dir(data, "evaluations"))
    return len(rows)


def prepare(data: Path, spans: int, evals: int) -> tuple[int, int]:
    """Build the store (spans, DAGs, evaluations) unless it is there; return (spans, evaluations)."""
    if not store.parquet_files(data, "spans"):
        gen.make_store(data, spans)
    if not store.parquet_files(data, "traces"):
        build_store(data, idle_seconds=0, full=True)
    if evals and not store.parquet_files(data, "evaluations"):
        add_evaluations(data, evals)
    con = connect(data)
    try:
        return con.sql("select count(*) from spans").fetchall()[0][0], con.sql("select count(*) from evaluations").fetchall()[0][0]
    finally:
        con.close()


# ---- what is timed ----------------------------------------------------------------------------

def plain_scan(data: Path) -> int:
    """Read the rule inputs of every pending step into Arrow."""
    con = connect(data)
    try:
        con.register("pending", inputs.pending_rule_builds(con))
        return con.sql(inputs.FACTS_CORE_SQL).to_arrow_table().num_rows
    finally:
        con.close()


def reference(data: Path) -> int:
    """The per-step reference rule pass over every pending step (rows built, not written)."""
    con = connect(data)
    try:
        return to_table(reference_rows(con)).num_rows
    finally:
        con.close()


def full_score(data: Path) -> int:
    """score_store on a store without step_scores: every step, rules and evaluations."""
    shutil.rmtree(table_dir(data, "step_scores"), ignore_errors=True)
    return score_store(data).steps


# ---- the run ----------------------------------------------------------------------------------

def measure(data: Path, runs: int) -> dict[str, Timing]:
    """Median timings of every line, each run measuring all of them in turn."""
    samples: dict[str, list[tuple[float, float]]] = {k: [] for k in ("scan", "reference", "score", "again")}
    for _ in range(runs):
        shutil.rmtree(table_dir(data, "step_scores"), ignore_errors=True)
        samples["scan"].append(_timed(lambda: plain_scan(data)))
        samples["reference"].append(_timed(lambda: reference(data)))
        samples["score"].append(_timed(lambda: full_score(data)))
        samples["again"].append(_timed(lambda: score_store(data)))
    return {k: _median(v) for k, v in samples.items()}


def render(spans: int, evals: int, runs: int, t: dict[str, Timing]) -> Table:
    """The figures of one run as a table."""
    table = Table(title=f"score_store: {spans:,} spans, {evals:,} evaluations, median of {runs} runs")
    for col in ("what", "wall s", "CPU s", "spans/s (wall)", "spans/s (CPU)", "wall ÷ score_store's"):
        table.add_column(col, justify="left" if col == "what" else "right")
    lines = [("baseline: plain scan of the rule inputs", "scan"),
             ("baseline: per-step reference rules", "reference"),
             ("score_store (rules + evaluations)", "score"),
             ("score_store again, nothing new", "again")]
    for label, key in lines:
        x = t[key]
        per_wall = f"{spans / x.wall:,.0f}" if key != "again" else "-"
        per_cpu = f"{spans / x.cpu:,.0f}" if key != "again" else "-"
        table.add_row(label, f"{x.wall:.3f}", f"{x.cpu:.3f}", per_wall, per_cpu, f"{x.wall / t['score'].wall:.2f}")
    return table


def main(argv: list[str] | None = None) -> int:
    """Build the store if needed, time the baselines and scoring, print a table."""
    ap = argparse.ArgumentParser(description="score_store benchmark (rules + evaluations)")
    ap.add_argument("--spans", type=int, default=300_000)
    ap.add_argument("--evals", type=int, default=10, help="evaluation results per 100 spans")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--data", type=Path, default=Path("/tmp/tracedag-bench-score"))
    args = ap.parse_args(argv)
    spans, evals = prepare(args.data, args.spans, args.evals)
    timings = measure(args.data, args.runs)
    Console(width=120).print(render(spans, evals, args.runs, timings))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
