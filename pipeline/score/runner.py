"""``score_store``: fill ``step_scores`` for the built steps not scored yet, incrementally.

Pass 1 (no network): the latest builds without rule rows get rule rows for every step, and
every evaluation on a latest-build step without an evaluation row for that build and metric is
mapped. Pass 2 (with a judge): every step of a latest build whose
step type has a rubric and that has no judge row for that rubric's metric on that build is
graded. Each pass writes its own Parquet files; ``build_id`` is the build scored, so the
``step_scores`` view drops scores of superseded builds by itself.

Pass 1 reads up to ``STEPS_PER_CHUNK`` steps with one scan (``scan``), gives the steps no rule
can fire on their passing rows column-wise and runs the rule table once per distinct set of
facts of the others (``columnar``; ``reference`` keeps the per-step loop it must match). The
evaluations are mapped on a cursor of their own beside it, and the files are written in the
background (``writes``).
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracedag.pipeline.engine import Bucket, Engine, bucket_target, plan_buckets
from tracedag.pipeline.progress import bars
from tracedag.pipeline.score import columnar, inputs, paramgen
from tracedag.pipeline.score.evaluations import MapStats, map_evaluations
from tracedag.pipeline.score.judge.cache import JudgeCache
from tracedag.pipeline.score.judge.config import JudgeConfig, JudgeStats, model_family
from tracedag.pipeline.score.judge.rubrics import load_rubrics
from tracedag.pipeline.score.materialize import PART_TRACES, MaterializeStats, materialize
from tracedag.pipeline.score.memory import spill_directory, spill_to
from tracedag.pipeline.score.provenance import provenance_round
from tracedag.pipeline.score.rows import FAILED_AT, ScoreRow, to_table
from tracedag.pipeline.score.scan import Scan, read_scan, with_input_texts
from tracedag.pipeline.score.writes import Writes, background_writes, score_lock
from tracedag.pipeline.store.files import new_file_name, parquet_files, rerun_if_vanished
from tracedag.pipeline.store.kept import Kept
from tracedag.pipeline.store.parquet import write_parquet_atomic
from tracedag.pipeline.store.views import connect, refresh_views
from tracedag.schemas.layout import state_file, table_dir

if TYPE_CHECKING:  # the judge needs the openai package; scoring without it must not
    from tracedag.pipeline.score.judge.client import JudgeTask

logger = logging.getLogger(__name__)

CACHE_FILE = "judge_cache.sqlite"
STEPS_PER_CHUNK = 400_000
"""Steps read by one scan: a chunk's facts and DuckDB's join are in memory together (300,000
generated steps and 31,000 evaluations peak at about 0.6 GB), and each chunk scans the spans."""


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
    engine: str = "local"  # where the rule pass ran: local | ray
    tasks: int = 0  # engine tasks run (one per trace-id bucket; 0: local)
    materialized: MaterializeStats | None = None  # the named queries' results written for the traces scored
    data_edges: int = 0  # value-provenance edges stored into dag_edges (score.provenance)

    def count_table(self, table: pa.Table, source: str, steps: int) -> None:
        """Add ``table`` (``STEP_SCORES_V1`` rows of ``source``, covering ``steps`` steps) to the counters."""
        self.rows_by_source[source] += table.num_rows
        self.steps_by_source[source] += steps
        failed = table.filter(pc.and_(pc.less_equal(table.column("score"), FAILED_AT),
                                      pc.is_valid(table.column("taxonomy_l1"))))
        levels = ["taxonomy_l1", "taxonomy_l2", "taxonomy_l3"]
        for r in failed.group_by(levels).aggregate([([], "count_all")]).to_pylist():
            self.failures_by_category[(r["taxonomy_l1"], r["taxonomy_l2"], r["taxonomy_l3"])] += r["count_all"]

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


def _write_rows(writes: Writes, rows: list[ScoreRow], stats: ScoreStats) -> None:
    if rows:
        writes.write(lambda: to_table(rows))
        stats.count(rows)


def _write(data: Path, rows: list[ScoreRow], stats: ScoreStats) -> None:
    if not rows:
        return
    stats.files.append(write_parquet_atomic(to_table(rows), table_dir(data, "step_scores")))
    stats.count(rows)


def _chunks(pending: pa.Table, max_steps: int) -> Iterator[pa.Table]:
    """Consecutive slices of ``pending`` of at most ``max_steps`` steps (or one build)."""
    ends = np.cumsum(pending.column("steps").to_numpy())
    start = 0
    while start < pending.num_rows:
        done = int(ends[start - 1]) if start else 0
        stop = max(start + 1, int(np.searchsorted(ends, done + max_steps, side="right")))
        yield pending.slice(start, stop - start)
        start = stop


def _distinct_steps(facts: pa.Table, mask: np.ndarray, chunk: pa.Table) -> int:
    """How many distinct (trace_id, span_id) the steps of ``facts`` under ``mask`` are."""
    if facts.num_rows == pc.sum(chunk.column("steps")).as_py():
        return int(mask.sum())  # a build has one node per span (dag.prep dedupes): one row per step
    steps = facts.select(["trace_id", "span_id"]).filter(pa.array(mask))
    if steps.num_rows == 0:
        return 0
    traces, spans = (pc.dictionary_encode(steps.column(c)).combine_chunks() for c in ("trace_id", "span_id"))
    pairs = traces.indices.to_numpy().astype(np.int64) * len(spans.dictionary) + spans.indices.to_numpy()
    return len(np.unique(pairs))


def _write_passing(writes: Writes, facts: pa.Table, quiet: np.ndarray, stats: ScoreStats) -> None:
    """Write the passing rows of the ``quiet`` steps, made and written in the background."""
    rows = columnar.passing_count(facts, quiet)
    if rows:
        writes.write(lambda: columnar.passing_rows(facts, quiet))
        stats.rows_by_source["rule"] += rows


def _score_chunk(writes: Writes, con: duckdb.DuckDBPyConnection, chunk: pa.Table, max_iterations: int | None,
                 stats: ScoreStats, advance: Advance, received_from: int = 0) -> None:
    scan = rerun_if_vanished(lambda: read_scan(con, chunk, max_iterations, received_from))
    quiet = columnar.quiet_mask(scan)
    _write_passing(writes, scan.facts, quiet, stats)  # while the other steps are scored
    rest, rows = rerun_if_vanished(lambda: _rule_rows(con, chunk, scan, quiet, max_iterations, received_from))
    if rows.num_rows:
        writes.write(lambda: rows)
    quiet_steps = _distinct_steps(scan.facts, quiet, chunk)
    stats.steps_by_source["rule"] += quiet_steps
    stats.count_table(rows, "rule", _distinct_steps(scan.facts, ~quiet, chunk))
    stats.steps += quiet_steps + rest.num_rows
    advance("rules", scan.facts.num_rows, -1)


def _rule_rows(con: duckdb.DuckDBPyConnection, chunk: pa.Table, scan: Scan, quiet: np.ndarray,
               max_iterations: int | None, received_from: int) -> tuple[pa.Table, pa.Table]:
    """The steps of ``scan`` a rule may fire on (not ``quiet``) with their input texts, and their rule rows with
    those of the LLM steps behind rejected tool calls (reads only: run again when a file vanished)."""
    rest = with_input_texts(con, scan.facts.filter(pa.array(~quiet)), scan.defs, received_from)
    rows = columnar.step_rows(rest, scan.defs, max_iterations)
    upstream = paramgen.upstream_table(con, chunk, rows, scan.calls, scan.defs)
    return rest, pa.concat_tables([rows, upstream]) if upstream.num_rows else rows


@dataclass(frozen=True)
class BucketRules:
    """What the rule pass made of one bucket of pending builds (``score_bucket``)."""

    passing: pa.Table  # the passing rows of the steps no rule can fire on
    rows: pa.Table  # the rule rows of the other steps, and of the LLM steps behind rejected tool calls
    quiet_steps: int
    rule_steps: int  # distinct steps among ``rows``' scanned steps
    steps: int  # steps scored (quiet + the others)
    facts: int  # facts rows scanned (progress)


def score_bucket(bucket: Bucket, pending: pa.Table, data: Path, max_iterations: int | None,
                 received_from: int = 0) -> BucketRules:
    """Pass 1 over the pending builds of ``bucket``'s traces (one engine task): ``_score_chunk``'s
    work on a connection of its own, returned rather than written."""
    chunk = pending.filter(pc.is_in(pending.column("trace_id"), value_set=bucket.trace_ids))
    con = _connect(data)
    try:
        scan = rerun_if_vanished(lambda: read_scan(con, chunk, max_iterations, received_from))
        quiet = columnar.quiet_mask(scan)
        rest, rows = rerun_if_vanished(lambda: _rule_rows(con, chunk, scan, quiet, max_iterations, received_from))
    finally:
        con.close()
    quiet_steps = _distinct_steps(scan.facts, quiet, chunk)
    return BucketRules(columnar.passing_rows(scan.facts, quiet), rows, quiet_steps,
                       _distinct_steps(scan.facts, ~quiet, chunk), quiet_steps + rest.num_rows, scan.facts.num_rows)


def _score_engine(data: Path, engine: Engine, pending: pa.Table, max_iterations: int | None, stats: ScoreStats,
                  advance: Advance, received_from: int) -> None:
    """Pass 1 as one engine task per trace-id bucket of ``pending``; each bucket's rows are written
    here as ``<run>-b<bucket>-passing`` and ``<run>-b<bucket>-rules``."""
    stats.engine = engine.name
    if not pending.num_rows:
        return
    per_trace = pending.group_by("trace_id").aggregate([("steps", "sum")]).sort_by("trace_id")
    steps = per_trace.column("steps_sum").to_numpy()
    zeros = np.zeros(per_trace.num_rows, dtype=np.int64)
    target = bucket_target(int(steps.sum()), engine.start(), STEPS_PER_CHUNK)
    buckets = plan_buckets(per_trace.column("trace_id").combine_chunks(), steps, zeros, zeros, target)
    run = new_file_name("rules")
    directory = table_dir(data, "step_scores")
    before = engine.tasks
    for k, result in engine.map_buckets(score_bucket, buckets, pending, data, max_iterations, received_from):
        stem = f"{run}-{buckets[k].name}"
        for part, table in (("passing", result.passing), ("rules", result.rows)):
            if table.num_rows:
                stats.files.append(write_parquet_atomic(table, directory, f"{stem}-{part}"))
        stats.rows_by_source["rule"] += result.passing.num_rows
        stats.steps_by_source["rule"] += result.quiet_steps
        stats.count_table(result.rows, "rule", result.rule_steps)
        stats.steps += result.steps
        advance("rules", result.facts, -1)
    stats.tasks += engine.tasks - before


def map_store_evaluations(con: duckdb.DuckDBPyConnection, stats: MapStats) -> list[ScoreRow]:
    """Map the evaluations on latest-build steps that have no evaluation row for that build yet."""
    rows, stats.unmatched_step = inputs.evaluation_rows(con)
    builds = {(r["trace_id"], r["span_id"]): r["build_id"] for r in rows}
    return map_evaluations(rows, builds, stats, inputs.evaluation_ranges(con))


def _beside(con: duckdb.DuckDBPyConnection, pool: ThreadPoolExecutor, stats: MapStats,
            data: Path) -> Future[list[ScoreRow]]:
    """``map_store_evaluations`` on a cursor of its own in ``pool``, beside the rule pass: the
    rule pass leaves a core idle while it runs Python, the evaluations one while DuckDB reads.
    A store without an evaluations file has none to map: no query (it would read every latest build's steps)."""
    if not parquet_files(data, "evaluations"):
        done: Future[list[ScoreRow]] = Future()
        done.set_result([])
        return done
    cursor = con.cursor()
    cursor.execute("set enable_progress_bar = false")

    def run() -> list[ScoreRow]:
        try:
            return rerun_if_vanished(lambda: map_store_evaluations(cursor, stats))
        finally:
            cursor.close()

    return pool.submit(run)


def score_rules(writes: Writes, con: duckdb.DuckDBPyConnection, stats: ScoreStats,
                max_iterations: int | None, advance: Advance, live: LiveRound | None = None,
                scored_through: int = 0, engine: Engine | None = None, data: Path | None = None) -> int:
    """Pass 1: rules for the latest builds that have no rule rows yet (made since ``scored_through``
    less ``LIVE_OVERLAP_NS`` when it is set); return the newest build time scored (or ``scored_through``).
    With ``engine`` (and the store's ``data``), one engine task per trace-id bucket (``_score_engine``)."""
    since = scored_through - LIVE_OVERLAP_NS if scored_through else 0
    pending = rerun_if_vanished(lambda: inputs.pending_rule_builds(con, since))
    stats.builds = pending.num_rows
    advance("rules", 0, int(pc.sum(pending.column("steps")).as_py() or 0))
    builds = set(pending.column("build_id").to_pylist())
    received_from = 0
    if live is not None and live.received_from is not None and builds == {live.build_id}:
        received_from = live.received_from
    if engine is not None and data is not None:
        _score_engine(data, engine, pending, max_iterations, stats, advance, received_from)
        return max([scored_through, *(_built_ns(b) for b in builds)])
    for chunk in _chunks(pending, STEPS_PER_CHUNK):
        _score_chunk(writes, con, chunk, max_iterations, stats, advance, received_from)
    return max([scored_through, *(_built_ns(b) for b in builds)])


def _built_ns(build_id: str) -> int:
    """The build time a build id (``build-<ns>-<hex>``) carries; 0 for any other id."""
    parts = build_id.split("-")
    return int(parts[1]) if len(parts) == 3 and parts[0] == "build" and parts[1].isdigit() else 0


def _scored_through(data: Path, live: LiveRound | None) -> int:
    """The newest build a live round scored (0: none, or not a live round: look at every build)."""
    if live is None:
        return 0
    try:
        return int(json.loads(state_file(data, _SCORE_WINDOW).read_text(encoding="utf-8"))["scored_through"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def _save_scored_through(data: Path, newest: int) -> None:
    path = state_file(data, _SCORE_WINDOW)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"scored_through": newest}), encoding="utf-8")
    os.replace(tmp, path)


def _judge_tasks(con: duckdb.DuckDBPyConnection, cfg: JudgeConfig) -> tuple[list[JudgeTask], list[str]]:
    from tracedag.pipeline.score.judge.client import JudgeTask

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
    from tracedag.pipeline.score.judge.client import Judge, run_judge

    jstats = stats.judge = JudgeStats(model=cfg.model)
    tasks, models = _judge_tasks(con, cfg)
    family = model_family(cfg.model)
    jstats.same_family_models = [m for m in models if family and model_family(m) == family]
    if jstats.same_family_models:
        logger.warning("judge %s is of the same model family (%s) as the agent's %s: its grades may be biased",
                       cfg.model, family, ", ".join(jstats.same_family_models))
    cache = JudgeCache(state_file(data, CACHE_FILE))
    judge = Judge(cfg, cache, jstats)
    try:
        advance("judge", 0, len(tasks))
        rows = run_judge(judge, tasks, lambda: advance("judge", 1, len(tasks)))
    finally:
        judge.close()
        cache.close()
    jstats.price(cfg.prices())
    _write(data, rows, stats)


@dataclass(frozen=True)
class LiveRound:
    """What the build of a live round wrote, so that its scoring reads the recent part of the store.

    The rule pass then looks for unscored builds only among those made since the last live
    round's (less ``LIVE_OVERLAP_NS``; ``state/score-window.json``), and when the only pending
    build is ``build_id``, reads the spans from ``received_from`` on (None: unknown, all of them).
    """

    build_id: str | None = None
    received_from: int | None = None
    materialize: bool = True  # False: the named queries' results are stored later (``materialize_later``)


LIVE_OVERLAP_NS = 60 * 10**9
"""How far before the newest build already scored a live round looks for unscored builds (a
build's rows may be written after a later round started; the wall clock may step back)."""

_SCORE_WINDOW = "score-window.json"


def score_store(data: Path, judge: JudgeConfig | None = None, progress: bool = False,
                *, max_iterations: int | None = None, live: LiveRound | None = None,
                engine: Engine | None = None, materialize_part: int = PART_TRACES,
                memory: int | None = None) -> ScoreStats:
    """Score the built steps not scored yet (rules, evaluations, and the judge when configured).

    Args:
        data: the data directory.
        judge: judge configuration; None scores with rules and evaluations only (no network).
        progress: show rich progress bars.
        max_iterations: flag loop iterations at or above this bound (rule ``iteration_bound``).
        live: a live round's hint (``LiveRound``); None looks at every build.
        engine: run the rule pass as one task per trace-id bucket on this engine (None: here).
        materialize_part: a round storing every trace's results does it in parts of this many traces.
        memory: DuckDB's memory limit (bytes) while storing results; None: ``score.memory.memory_limit``.
    Returns:
        ``ScoreStats``: steps and rows by source, failures by category, judge tokens and cost.
    """
    stats = ScoreStats()
    stores = live is None or live.materialize
    with score_lock(data), ExitStack() as stack:
        # one connection for the round (~50 ms CPU each: rules, data edges, stored results each made one); when it
        # stores results it spills where they do from the start (DuckDB cannot switch its directory once used)
        spill = stack.enter_context(spill_directory(data)) if stores else None
        con = stack.enter_context(_round_connection(data, spill))  # closed before the spill directory goes
        con = _score_locked(con, data, judge, progress, max_iterations, stats, live, engine)
        _provenance(data, stats, con, live)
        if stores:
            _materialize(data, stats, part=materialize_part, memory=memory, con=con)
    logger.info("scored %d steps of %d builds into %d files", stats.steps, stats.builds, len(stats.files))
    return stats


def _score_locked(con: duckdb.DuckDBPyConnection, data: Path, judge: JudgeConfig | None, progress: bool,
                  max_iterations: int | None, stats: ScoreStats, live: LiveRound | None = None,
                  engine: Engine | None = None) -> duckdb.DuckDBPyConnection:
    """Pass 1 and (``judge``) pass 2 on ``con``; return it."""
    with _progress(progress) as advance:
        with (background_writes(table_dir(data, "step_scores"), stats.files) as writes,
              ThreadPoolExecutor(1, thread_name_prefix="score-evals") as pool):
            evaluations = _beside(con, pool, stats.evaluations, data)
            newest = score_rules(writes, con, stats, max_iterations, advance, live, _scored_through(data, live),
                                 engine, data)
            _write_rows(writes, evaluations.result(), stats)
        if live is not None:
            _save_scored_through(data, newest)
        if judge is not None:
            refresh_views(con, data)  # see the rule rows just written (a first round's step_scores had no files)
            score_judge(data, con, judge, stats, advance)
    return con


def _provenance(data: Path, stats: ScoreStats, con: duckdb.DuckDBPyConnection | None = None,
                live: LiveRound | None = None) -> None:
    """Store the ``data`` edges into the failed tool steps just scored (``score.provenance``; on ``con`` when
    given; a ``live`` round's build: the spans of the traces it built, from their earliest arrival), before the
    named queries are materialized; a failure loses nothing but those edges (logged)."""
    built = None
    if live is not None and live.build_id is not None and live.received_from is not None:
        built = (live.build_id, live.received_from)
    try:
        stats.data_edges = rerun_if_vanished(lambda: provenance_round(data, stats.files, con, built))
    except (duckdb.Error, OSError, pa.ArrowException):
        logger.exception("storing the data edges (value provenance) failed")


def _materialize(data: Path, stats: ScoreStats, limit: int | None = None, part: int = PART_TRACES,
                 memory: int | None = None, con: duckdb.DuckDBPyConnection | None = None) -> None:
    """Write the named queries' results of the traces scored (``score.materialize``, on ``con`` when given),
    inside the score lock.

    A failure here loses nothing: the named queries compute from their SQL until a later round
    materializes the traces left (they are the ones without a ``materialized_traces`` row).
    """
    try:
        stats.materialized = rerun_if_vanished(
            lambda: materialize(data, stats.files, limit=limit, part=part, memory=memory, con=con))
    except (duckdb.Error, OSError, pa.ArrowException):
        logger.exception("materializing the named queries failed; they compute from their SQL meanwhile")


def materialize_later(data: Path, scored_files: list[Path], limit: int | None = None) -> MaterializeStats | None:
    """Store the named queries' results that live rounds left (``LiveRound.materialize`` False), under the score
    lock: the traces of ``scored_files`` and every trace whose latest build has none yet (the first parts of
    about ``limit`` traces of them, whole conversations; None: all). Every build is scored by then when the
    caller is the only builder (the live collector builds and scores in one loop)."""
    stats = ScoreStats(files=list(scored_files))
    with score_lock(data):
        _materialize(data, stats, limit)
    return stats.materialized


@contextmanager
def _round_connection(data: Path, spill: Path | None) -> Iterator[duckdb.DuckDBPyConnection]:
    """A score round's connection. A round that stores nothing (``spill`` None: a live round) takes the one kept
    for the last such round on ``data`` (``ROUND_CONNECTION``, ``store.kept``), its views brought to the store as
    it is (``views.refresh_views``: ~3 ms CPU against ~60 ms for a new connection with its views); any other
    round a new one, closed after."""
    if spill is not None:
        with closing(_connect(data, spill)) as con:
            yield con
        return
    with ROUND_CONNECTION.use(data) as con:
        yield con


def _connect(data: Path, spill: Path | None = None) -> duckdb.DuckDBPyConnection:
    """A connection with the views and no shared macro (scoring calls none of them), spilling to ``spill`` if given
    (then a database of its own: the spill directory and the memory limit are the database's)."""
    con: duckdb.DuckDBPyConnection = connect(data, shared_macros=False, private=spill is not None)
    con.execute("set enable_progress_bar = false")  # our own bars, not DuckDB's
    if spill is not None:
        spill_to(con, spill)
    return con


ROUND_CONNECTION = Kept("score round", _connect, refresh_views)
"""The connection live rounds score on, kept from one round to the next (one per process, for one store)."""


@contextmanager
def _progress(enabled: bool) -> Iterator[Advance]:
    """One bar per phase (``score: rules``, ``score: judge``), kept when the run ends."""
    with bars(enabled, transient=False) as advance:
        yield lambda phase, n, total: advance(f"score: {phase}", n, None if total < 0 else total)
