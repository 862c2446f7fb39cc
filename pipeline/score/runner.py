"""``score_store``: fill ``step_scores`` for the built steps not scored yet, incrementally.

Pass 1 (no network): the latest builds without rule rows get rule rows for every step, and
every evaluation on a latest-build step without an evaluation row for that build and metric is
mapped. Pass 2 (with a judge): every step of a latest build whose
step type has a rubric and that has no judge row for that rubric's metric on that build is
graded. Each pass writes its own Parquet files; ``build_id`` is the build scored, so the
``step_scores`` view drops scores of superseded builds by itself.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb
import pyarrow as pa

from tracedag.pipeline.score import inputs
from tracedag.pipeline.score.evaluations_map import MapStats, map_evaluations
from tracedag.pipeline.score.judge import JudgeConfig, JudgeStats, model_family
from tracedag.pipeline.score.judge_cache import JudgeCache
from tracedag.pipeline.score.rows import ScoreRow, passing_table, to_table
from tracedag.pipeline.score.rubrics import load_rubrics
from tracedag.pipeline.score.rules import PASS_EXPLANATION, PASS_RULE, PASS_SCORE, score_step
from tracedag.pipeline.store.parquet import write_parquet_atomic
from tracedag.pipeline.store.views import connect
from tracedag.schemas.fsio import file_lock
from tracedag.schemas.layout import SCORE_LOCK, judge_cache_file, lock_path, table_dir

if TYPE_CHECKING:  # the judge needs the openai package; scoring without it must not
    from tracedag.pipeline.score.judge_client import JudgeTask

logger = logging.getLogger(__name__)

CACHE_FILE = "judge_cache.sqlite"
TRACES_PER_CHUNK = 5_000


@dataclass
class ScoreStats:
    """What one ``score_store`` run did."""

    builds: int = 0
    steps: int = 0
    rows_by_source: Counter[str] = field(default_factory=Counter)
    steps_by_source: Counter[str] = field(default_factory=Counter)
    failures_by_category: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    evaluations: MapStats = field(default_factory=MapStats)
    judge: JudgeStats | None = None
    files: list[Path] = field(default_factory=list)

    def count(self, rows: list[ScoreRow]) -> None:
        """Add ``rows`` to the counters."""
        steps: dict[str, set[tuple[str, str]]] = {}
        for r in rows:
            self.rows_by_source[r.source] += 1
            steps.setdefault(r.source, set()).add((r.trace_id, r.span_id))
            if r.failed and r.category is not None:
                self.failures_by_category[(r.category.l1, r.category.l2, r.category.l3)] += 1
        for source, keys in steps.items():
            self.steps_by_source[source] += len(keys)


Advance = Callable[[str, int, int], None]  # (phase, steps done, total or -1 to keep the total)


def _write(data: Path, rows: list[ScoreRow], stats: ScoreStats) -> None:
    if not rows:
        return
    stats.files.append(write_parquet_atomic(to_table(rows), table_dir(data, "step_scores")))
    stats.count(rows)


def _chunks(table: pa.Table, size: int) -> Iterator[pa.Table]:
    for start in range(0, table.num_rows, size):
        yield table.slice(start, size)


def _write_quiet(data: Path, keys: pa.Table, stats: ScoreStats) -> int:
    """Write the passing rows of the quiet steps; return how many steps they cover."""
    if keys.num_rows == 0:
        return 0
    table = passing_table(keys, PASS_RULE, PASS_EXPLANATION, PASS_SCORE)
    stats.files.append(write_parquet_atomic(table, table_dir(data, "step_scores")))
    steps = len(set(zip(keys.column("trace_id").to_pylist(), keys.column("span_id").to_pylist(), strict=True)))
    stats.rows_by_source["rule"] += keys.num_rows
    stats.steps_by_source["rule"] += steps
    return steps


def _score_chunk(data: Path, con: duckdb.DuckDBPyConnection, chunk: pa.Table, max_iterations: int | None,
                 stats: ScoreStats, advance: Advance) -> list[ScoreRow]:
    inputs.use_pending(con, chunk)
    quiet = _write_quiet(data, inputs.quiet_rows(con, max_iterations), stats)
    stats.steps += quiet
    advance("rules", quiet, -1)
    defs = inputs.tool_definitions(con)
    rows: list[ScoreRow] = []
    for facts in inputs.step_facts(con, defs, max_iterations):
        for f in facts:
            rows.extend(score_step(f))
        stats.steps += len(facts)
        advance("rules", len(facts), -1)
    inputs.done_pending(con)
    return rows


def score_evaluations(data: Path, con: duckdb.DuckDBPyConnection, stats: ScoreStats) -> None:
    """Map the evaluations on latest-build steps that have no evaluation row for that build yet."""
    rows = inputs.evaluation_rows(con)
    builds = {(r["trace_id"], r["span_id"]): r["build_id"] for r in rows}
    stats.evaluations.unmatched_step = inputs.evaluations_off_dag(con)
    _write(data, map_evaluations(rows, builds, stats.evaluations, inputs.evaluation_ranges(con)), stats)


def score_rules(data: Path, con: duckdb.DuckDBPyConnection, stats: ScoreStats,
                max_iterations: int | None, advance: Advance) -> None:
    """Pass 1: rules for the latest builds that have no rule rows yet."""
    pending = inputs.pending_rule_builds(con)
    stats.builds = pending.num_rows
    advance("rules", 0, inputs.pending_steps(con, pending))
    for chunk in _chunks(pending, TRACES_PER_CHUNK):
        _write(data, _score_chunk(data, con, chunk, max_iterations, stats, advance), stats)


def _judge_tasks(con: duckdb.DuckDBPyConnection, cfg: JudgeConfig) -> tuple[list[JudgeTask], list[str]]:
    from tracedag.pipeline.score.judge_client import JudgeTask

    rubrics = {(rb.step_type, rb.metric): rb for group in load_rubrics(cfg.rubric_dir).values() for rb in group}
    tasks: list[JudgeTask] = []
    models: set[str] = set()
    for r in inputs.judge_candidates(con, sorted(rubrics), cfg.max_steps):
        if r["model"]:
            models.add(r["model"])
        step = inputs.judge_input(r, cfg.max_chars, cfg.max_upstream)
        tasks.extend(JudgeTask(r["trace_id"], r["span_id"], r["build_id"], rubrics[(r["step_type"], m)], step)
                     for m in r["todo"])
    return tasks, sorted(models)


def score_judge(data: Path, con: duckdb.DuckDBPyConnection, cfg: JudgeConfig, stats: ScoreStats,
                advance: Advance) -> None:
    """Pass 2: grade every latest-build step whose rubric metric has no judge row on that build."""
    from tracedag.pipeline.score.judge_client import Judge, run_judge

    jstats = stats.judge = JudgeStats(model=cfg.model)
    tasks, models = _judge_tasks(con, cfg)
    family = model_family(cfg.model)
    jstats.same_family_models = [m for m in models if family and model_family(m) == family]
    if jstats.same_family_models:
        logger.warning("judge %s is of the same model family (%s) as the agent's %s: its grades may be biased",
                       cfg.model, family, ", ".join(jstats.same_family_models))
    cache = JudgeCache(judge_cache_file(data, CACHE_FILE))
    judge = Judge(cfg, cache, jstats)
    try:
        advance("judge", 0, len(tasks))
        rows = run_judge(judge, tasks, lambda: advance("judge", 1, len(tasks)))
    finally:
        judge.close()
        cache.close()
    jstats.price(cfg.prices())
    _write(data, rows, stats)


def score_store(data: Path, judge: JudgeConfig | None = None, progress: bool = False,
                *, max_iterations: int | None = None) -> ScoreStats:
    """Score the built steps not scored yet (rules, evaluations, and the judge when configured).

    Args:
        data: the data directory.
        judge: judge configuration; None scores with rules and evaluations only (no network).
        progress: show rich progress bars.
        max_iterations: flag loop iterations at or above this bound (rule ``iteration_bound``).
    Returns:
        ``ScoreStats``: steps and rows by source, failures by category, judge tokens and cost.
    """
    stats = ScoreStats()
    with score_lock(data):
        _score_locked(data, judge, progress, max_iterations, stats)
    logger.info("scored %d steps of %d builds into %d files", stats.steps, stats.builds, len(stats.files))
    return stats


def score_lock(data: Path) -> AbstractContextManager[bool]:
    """One scorer at a time per data directory (two would score the same builds twice)."""
    return file_lock(lock_path(data, SCORE_LOCK))


def _score_locked(data: Path, judge: JudgeConfig | None, progress: bool, max_iterations: int | None,
                  stats: ScoreStats) -> None:
    con = _connect(data)
    try:
        with _progress(progress) as advance:
            score_rules(data, con, stats, max_iterations, advance)
            score_evaluations(data, con, stats)
            if judge is not None:
                con.close()
                con = _connect(data)  # see the rule rows just written
                score_judge(data, con, judge, stats, advance)
    finally:
        con.close()


def _connect(data: Path) -> duckdb.DuckDBPyConnection:
    con: duckdb.DuckDBPyConnection = connect(data)
    con.execute("set enable_progress_bar = false")  # our own bars, not DuckDB's
    return con


@contextmanager
def _progress(enabled: bool) -> Iterator[Advance]:
    if not enabled:
        yield lambda phase, n, total: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  transient=False) as bar:
        ids: dict[str, object] = {}

        def advance(phase: str, n: int, total: int) -> None:
            if phase not in ids:
                ids[phase] = bar.add_task(f"score: {phase}", total=None if total < 0 else total)
            if total >= 0:
                bar.update(ids[phase], total=total)  # type: ignore[arg-type]
            bar.update(ids[phase], advance=n)  # type: ignore[arg-type]

        yield advance
