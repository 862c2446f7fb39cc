"""The store-level driver: find complete, new or changed traces and rebuild their DAGs.

A trace needs a build when it is new, or when spans arrived for it after its last build (a late
span). A plan reads only the spans files written since the last one and keeps the traces still
open in ``<data>/state/build-window/`` (``tracedag.pipeline.dag.window``), so a live round costs
what arrived, not the size of the store; with no usable state (first build, other settings, a
crash, a compaction that merged files no plan saw) it reads every file and compares with the
``traces`` table, whose ``last_received_unix_nano`` and ``span_count`` the build recorded.
``traces`` files are written last, so a crash between files only leaves rows of a build the views
never show, and the next run redoes that trace. ``<data>/state/build.json`` keeps the summary of
the last build and ``<data>/state/build.lock`` serializes concurrent builds.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, closing, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracedag.collector import faults
from tracedag.pipeline.dag.kept import PLAN
from tracedag.pipeline.dag.siblings import DEFAULT_TOLERANCE_NS, arrow
from tracedag.pipeline.dag.timing import stage
from tracedag.pipeline.dag.window import (
    OPEN_SCHEMA,
    RETAIN_NS,
    Window,
    clear_window,
    load_window,
    new_files,
    relative,
    save_window,
    spans_listing,
)
from tracedag.pipeline.engine import Engine, bucket_target, plan_buckets
from tracedag.pipeline.progress import bars
from tracedag.pipeline.store.gc import GcSettings, GcStats, mark_inflight, remove_crashed_build
from tracedag.pipeline.store.parquet import write_parquet_atomic
from tracedag.pipeline.store.swap import collect
from tracedag.pipeline.store.views import read_list_sql
from tracedag.schemas.fsio import file_lock
from tracedag.schemas.layout import BUILD_LOCK, build_state_file, build_tmp_dir, state_file, table_dir

if TYPE_CHECKING:
    from tracedag.pipeline.dag.spec import WorkflowSpec

# The reconstruction (``reconstruct``, ``chunks``, ``buckets``: polars, networkx) and the spec reader (yaml)
# are imported where a build runs: a build with nothing to do, and ``tracedag show``, do without (~0.5 s CPU).

logger = logging.getLogger(__name__)

CHUNK_SPANS = 500_000
"""Spans reconstructed together; bounds memory (about 1 KB of working set per span)."""

DAG_LAYOUT = "dag=3"
"""What the derived tables hold (2: ``dag_nodes.step_role``, ``tool_call`` edges, remote clock skew; 3:
``dag_edges.src_trace_id``, ``data_arg``, ``data_from`` for the score's ``data`` edges). A
store built by another layout is rebuilt in full once, and the collection after that build deletes
every older file, so no view mixes the two column sets."""

# The arrival figures of each trace in a set of spans files (``{source}``).
_FIGURES_SQL = """
select trace_id, count({count}) as n, min(received_unix_nano) as first_received,
       max(received_unix_nano) as last_received,
       -- spans from files (tracedag ingest) are complete when their file is: no idle wait for them
       coalesce(max(received_unix_nano) filter (where not (batch_id like '%-file' or batch_id like 'file-%')), 0)
           as last_live,
       -- the root span ends last, so it is exported last: once it is in, the trace is done
       coalesce(max(received_unix_nano) filter (where parent_span_id is null), 0) as root_received
from {source} group by trace_id
"""

# A full plan: every spans file; a trace changed when the build of it saw other spans.
_FULL_SQL = f"""
with s as ({_FIGURES_SQL.format(count="distinct span_id", source="{source}")})
select s.*, t.trace_id is null or t.last_received_unix_nano is distinct from s.last_received
           or t.span_count is distinct from s.n as changed, true as known
from s left join (
    -- each trace's latest build, as the ``traces`` view keeps it (the plan connects with traces_all only)
    select trace_id, arg_max(last_received_unix_nano, (built_unix_nano, build_id)) as last_received_unix_nano,
           arg_max(span_count, (built_unix_nano, build_id)) as span_count
    from traces_all group by trace_id
) t using (trace_id)
order by s.trace_id
"""

# An incremental plan: the figures of the new files merged with the open traces (``window``).
# A trace with a row in a new file has changed; an open one without, if it was not built yet.
_MERGE_SQL = """
with m as (
    select coalesce(f.trace_id, o.trace_id) as trace_id, coalesce(f.n, 0) + coalesce(o.n, 0) as n,
           least(coalesce(f.first_received, o.first_received), coalesce(o.first_received, f.first_received))
               as first_received,
           greatest(coalesce(f.last_received, 0), coalesce(o.last_received, 0)) as last_received,
           greatest(coalesce(f.last_live, 0), coalesce(o.last_live, 0)) as last_live,
           greatest(coalesce(f.root_received, 0), coalesce(o.root_received, 0)) as root_received,
           f.trace_id is not null or not o.built as changed,
           -- its first arrival is known: open, or never built (all its spans are in new files)
           o.trace_id is not null or not exists (select 1 from traces_all t where t.trace_id = f.trace_id) as known
    from fresh f full join open_w o on f.trace_id = o.trace_id
)
-- an unknown first arrival stays unknown while the trace is open: 0, read from the beginning
select * replace (case when known then first_received else 0 end as first_received) from m
order by trace_id
"""

Callback = Callable[[int], None]
_BAR = "building DAGs (spans)"


@dataclass
class BuildStats:
    """What one build run did."""

    build_id: str
    built_unix_nano: int
    traces_built: int = 0
    spans: int = 0
    nodes: int = 0
    edges: int = 0
    traces_pending: int = 0  # still receiving spans (younger than the idle time)
    traces_unchanged: int = 0  # looked at (all with a full plan, the open ones otherwise) and left as built
    methods: dict[str, int] = field(default_factory=dict)
    orphans: int = 0
    clock_skew: int = 0
    deviant: int = 0
    seconds: float = 0.0
    files: list[str] = field(default_factory=list)
    skipped: bool = False  # nothing changed since the last run: the spans were not even scanned
    plan: str = ""  # incremental (read the new spans files only) | full (read them all)
    received_from: int | None = None  # earliest arrival among the traces built (None: unknown)
    gc: GcStats | None = None  # superseded rows removed and small files merged after the build
    engine: str = "local"  # where the traces were reconstructed: local | ray
    tasks: int = 0  # engine tasks run (one per bucket; 0: local)


@dataclass(frozen=True)
class Plan:
    """Which traces to build now, in chunks of trace ids, and what to read for them."""

    chunks: list[pa.Array]  # trace ids, sorted
    pending: int
    unchanged: int
    spans: int
    next_due_unix_nano: int | None  # when the oldest pending trace becomes complete
    files: list[Path] = field(default_factory=list)  # the spans files the plan saw: the build reads these
    received_from: int | None = None  # earliest arrival among the traces to build (None: read every file)
    open_traces: pa.Table = field(default_factory=OPEN_SCHEMA.empty_table)  # the next plan's open traces
    full_reason: str | None = None  # why the plan read every file (None: it read only the new ones)
    # trace_id, n, first_received, last_received of the traces to build, in chunk order (engine buckets)
    figures: pa.Table | None = None


def plan_build(con: duckdb.DuckDBPyConnection, data: Path, listing: list[Path], window: Window | None,
               now_ns: int, idle_ns: int, full: bool, chunk_spans: int, grace_ns: int | None = None) -> Plan:
    """Pick the complete traces that are new or changed (all complete ones with ``full``).

    A live trace is complete once no span arrived for ``idle_ns``; with ``grace_ns``, also once its
    root span is in and nothing arrived for ``grace_ns`` (a later straggler makes it change and be
    built again). The figures come from the files of ``listing`` that ``window`` has not seen
    (``tracedag.pipeline.dag.window``), or from all of them when there is no usable window or
    ``full`` is set.
    """
    new = new_files(data, listing, None if full else window)
    if new.full_reason is None:
        t = _merged_figures(con, data, new.fresh, window.open if window is not None else OPEN_SCHEMA.empty_table())
    else:
        t = arrow(con, _FULL_SQL.format(source=read_list_sql(data, listing))) if listing else _no_figures()
    return _decide(t, listing, now_ns, idle_ns, full, chunk_spans, grace_ns, new.full_reason)


def _no_figures() -> pa.Table:
    return pa.table({**{f.name: pa.array([], f.type) for f in OPEN_SCHEMA if f.name != "built"},
                     "changed": pa.array([], pa.bool_()), "known": pa.array([], pa.bool_())})


def _merged_figures(con: duckdb.DuckDBPyConnection, data: Path, fresh: list[Path], open_traces: pa.Table) -> pa.Table:
    if fresh:
        figures = arrow(con, _FIGURES_SQL.format(count="*", source=read_list_sql(data, fresh)))
    else:
        figures = OPEN_SCHEMA.empty_table().drop_columns(["built"])
    con.register("fresh", figures)
    con.register("open_w", open_traces)
    try:
        return arrow(con, _MERGE_SQL)
    finally:
        con.unregister("fresh")
        con.unregister("open_w")


def _ints(t: pa.Table, name: str) -> np.ndarray:
    return np.asarray(t.column(name).to_numpy(zero_copy_only=False), dtype=np.int64)


def _bools(t: pa.Table, name: str) -> np.ndarray:
    return np.asarray(t.column(name).to_numpy(zero_copy_only=False), dtype=np.bool_)


def _decide(t: pa.Table, listing: list[Path], now_ns: int, idle_ns: int, full: bool, chunk_spans: int,
            grace_ns: int | None, full_reason: str | None) -> Plan:
    last, n, changed = _ints(t, "last_live"), _ints(t, "n"), _bools(t, "changed")
    wait = np.full(last.shape, idle_ns, dtype=np.int64)
    if grace_ns is not None:
        wait[_ints(t, "root_received") > 0] = min(grace_ns, idle_ns)
    pending = last > now_ns - wait
    build = ~pending & (changed | full)
    ids = t.column("trace_id").filter(pa.array(build)).combine_chunks()
    sizes = n[build]
    # chunk k takes the traces whose first span falls in [k * chunk_spans, (k + 1) * chunk_spans)
    chunk = (np.cumsum(sizes) - sizes) // max(chunk_spans, 1)
    starts = np.flatnonzero(np.diff(chunk, prepend=-1))
    ends = np.append(starts[1:], sizes.size) if sizes.size else starts
    first = _ints(t, "first_received")[build]
    return Plan(
        chunks=[ids.slice(int(a), int(b - a)) for a, b in zip(starts, ends, strict=True)],
        pending=int(pending.sum()),
        unchanged=int((~pending & ~build).sum()),
        spans=int(sizes.sum()),
        next_due_unix_nano=int((last + wait)[pending].min()) if pending.any() else None,
        files=listing,
        received_from=int(first.min()) or None if first.size else None,  # 0: unknown, read every file
        open_traces=_still_open(t, build | ~changed, now_ns),
        full_reason=full_reason,
        figures=t.filter(pa.array(build)).select(["trace_id", "n", "first_received", "last_received"]),
    )


def _still_open(t: pa.Table, built: np.ndarray, now_ns: int) -> pa.Table:
    """The traces to keep open: not built yet, or built and still within ``RETAIN_NS`` of their last arrival."""
    keep = ~built | (_ints(t, "last_received") >= now_ns - RETAIN_NS)
    figures = t.select([f.name for f in OPEN_SCHEMA if f.name != "built"])
    return figures.append_column("built", pa.array(built, pa.bool_())).filter(pa.array(keep)).cast(OPEN_SCHEMA)


def _lock(data: Path) -> AbstractContextManager[bool]:
    return file_lock(state_file(data, BUILD_LOCK))


def _files_hash(listing: list[Path]) -> str:
    """Hash of the spans files (path, size, mtime): changes whenever spans arrive or are compacted."""
    h = hashlib.sha256()
    for f in listing:
        try:
            st = f.stat()
        except FileNotFoundError:  # in an object store (its name never changes), or compacted away since
            h.update(f"{f}\n".encode())
            continue
        h.update(f"{f}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _load_state(data: Path) -> dict[str, Any]:
    try:
        state: dict[str, Any] = json.loads(build_state_file(data).read_text(encoding="utf-8"))
        return state
    except (OSError, ValueError):
        return {}


def _save_state(data: Path, stats: BuildStats, marks: dict[str, Any]) -> None:
    path = build_state_file(data)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({**marks, "last_build": asdict(stats)}, indent=2), encoding="utf-8")
    os.replace(tmp, path)


def _nothing_to_do(state: dict[str, Any], marks: dict[str, Any], now: int) -> bool:
    """True when nothing changed since the last run and no pending trace has become complete since."""
    due = state.get("next_due_unix_nano")
    same = all(state.get(k) == marks[k] for k in ("files", "settings", "idle_seconds"))
    return same and (due is None or now < due)


def new_build_id(now_ns: int) -> str:
    """A unique build id that sorts by time."""
    return f"build-{now_ns:020d}-{uuid.uuid4().hex[:8]}"


def build_store(
    data: Path,
    idle_seconds: float = 30.0,
    full: bool = False,
    spec: Path | None = None,
    progress: bool = False,
    tolerance_ns: int = DEFAULT_TOLERANCE_NS,
    chunk_spans: int = CHUNK_SPANS,
    compact: bool = False,
    gc: GcSettings | None = None,
    grace_seconds: float | None = None,
    engine: Engine | None = None,
) -> BuildStats:
    """Rebuild the DAGs of the complete traces that are new or changed since the last build.

    Then (same lock) remove the rows of superseded builds and merge small files when due (``compact``:
    merge the small files of every derived table now); see ``tracedag.pipeline.store.gc``. With
    ``engine``, the traces are reconstructed as one engine task per bucket (``_run_engine``); the
    plan, the writes, the state and the collection stay here.
    """
    t0 = time.perf_counter()
    workflow = _load_spec(spec) if spec is not None else None
    spec_hash = hashlib.sha256(spec.read_bytes()).hexdigest() if spec is not None else None
    with _lock(data):
        now = time.time_ns()
        stats = BuildStats(build_id=new_build_id(now), built_unix_nano=now)
        remove_crashed_build(data)
        state = _load_state(data)
        listing = spans_listing(data)  # what this build plans from and reads
        # settings that change the result of every trace: a change rebuilds everything once
        marks: dict[str, Any] = {"files": _files_hash(listing), "idle_seconds": [idle_seconds, grace_seconds],
                                 "settings": f"tolerance={tolerance_ns};spec={spec_hash};{DAG_LAYOUT}"}
        if not full and _nothing_to_do(state, marks, now):
            stats.skipped = True
            stats.gc = collect(data, gc, compact=True) if compact else None
            stats.seconds = round(time.perf_counter() - t0, 3)
            return stats
        full = full or state.get("settings", marks["settings"]) != marks["settings"]
        window = None if full else load_window(data)
        clear_window(data)  # until this build is done: a crash in it makes the next plan a full one
        with PLAN.use(data) as con:  # the plan reads traces_all only: no other view (``dag.kept``)
            with stage("plan"):
                grace = None if grace_seconds is None else int(grace_seconds * 1e9)
                plan = plan_build(con, data, listing, window, now, int(idle_seconds * 1e9), full, chunk_spans, grace)
            # a full plan read every spans file, and DuckDB keeps its buffers while open: closed before the build;
            # an incremental one read the new files only: kept for the collection and the next round's plan
            kept = con if plan.full_reason is None else None
            if kept is None:
                PLAN.drop(con)
                logger.info("full build plan: %s", plan.full_reason)
            _build(data, plan, stats, workflow, tolerance_ns, progress, engine)
            if (stats.traces_built and (gc is None or gc.enabled)) or compact:
                with stage("gc"):
                    stats.gc = collect(data, gc, compact=compact, con=kept)
        stats.seconds = round(time.perf_counter() - t0, 3)
        _save_state(data, stats, {**marks, "next_due_unix_nano": plan.next_due_unix_nano})
    logger.info("build %s: %d traces, %d spans in %.2fs", stats.build_id, stats.traces_built, stats.spans, stats.seconds)
    return stats


def _build(data: Path, plan: Plan, stats: BuildStats, workflow: WorkflowSpec | None, tolerance_ns: int,
           progress: bool, engine: Engine | None) -> None:
    """Reconstruct and write the traces of ``plan``, then save the window for the next plan."""
    stats.traces_pending, stats.traces_unchanged = plan.pending, plan.unchanged
    stats.plan = "full" if plan.full_reason is not None else "incremental"
    stats.received_from = plan.received_from
    if engine is None:
        _run(data, plan, stats, workflow, tolerance_ns, progress)
    else:
        _run_engine(data, plan, stats, workflow, tolerance_ns, progress, engine)
    save_window(data, Window({relative(data, f) for f in plan.files}, plan.open_traces))


def _load_spec(path: Path) -> WorkflowSpec:
    from tracedag.pipeline.dag.spec import load_spec

    return load_spec(path)


def _run(
    data: Path,
    plan: Plan,
    stats: BuildStats,
    spec: WorkflowSpec | None,
    tolerance_ns: int,
    progress: bool,
) -> None:
    if not plan.chunks:
        return
    from tracedag.pipeline.dag.chunks import Source, chunk_tables
    from tracedag.pipeline.dag.reconstruct import reconstruct

    tmp = build_tmp_dir(data, stats.build_id)
    mark_inflight(data, stats.build_id)
    source = Source(data, plan.files, plan.received_from)
    with _spans_bar(progress, plan.spans) as advance, closing(chunk_tables(source, plan.chunks, tmp)) as tables:
        for i in range(len(plan.chunks)):
            # no local name for the input: reconstruct frees it as soon as it has prepared its own copy
            traces, nodes, edges = reconstruct(_timed_next(tables), stats.build_id, stats.built_unix_nano,
                                               tolerance_ns, spec)
            _write(data, stats, i, traces, nodes, edges)
            advance(nodes.num_rows)
    mark_inflight(data, None)


def _run_engine(data: Path, plan: Plan, stats: BuildStats, spec: WorkflowSpec | None, tolerance_ns: int,
                progress: bool, engine: Engine) -> None:
    """``_run`` on an engine: one task per bucket (``build_bucket``), each bucket written here as
    ``<build_id>-b<bucket>`` as its task finishes."""
    stats.engine = engine.name
    if not plan.chunks or plan.figures is None:
        return
    f = plan.figures
    target = bucket_target(plan.spans, engine.start(), CHUNK_SPANS)
    buckets = plan_buckets(f.column("trace_id").combine_chunks(), _ints(f, "n"), _ints(f, "first_received"),
                           _ints(f, "last_received"), target)
    from tracedag.pipeline.dag.buckets import build_bucket
    from tracedag.pipeline.dag.chunks import Source

    mark_inflight(data, stats.build_id)
    source = Source(data, plan.files, plan.received_from)
    before = engine.tasks
    with _spans_bar(progress, plan.spans) as advance:
        for k, (traces, nodes, edges) in engine.map_buckets(build_bucket, buckets, source, stats.build_id,
                                                            stats.built_unix_nano, tolerance_ns, spec):
            _write(data, stats, k, traces, nodes, edges, label=buckets[k].name)
            advance(nodes.num_rows)
    stats.tasks = engine.tasks - before
    mark_inflight(data, None)


def _timed_next(tables: Iterator[pa.Table]) -> pa.Table:
    with stage("read"):
        return next(tables)


TRACE_ROW_GROUP = 16 * 1024
"""Rows per row group of a build's files: sorted by trace id, a reader looking for one trace (``show``,
``/api/traces/{id}``) skips every row group whose trace_id statistics do not hold it."""


def by_trace(table: pa.Table) -> pa.Table:
    """``table`` sorted by trace id (stable: a trace's rows keep their order); a reconstruction's tables are
    already (``output``), and then returned as they are."""
    if table.num_rows < 2 or _sorted(table.column("trace_id")):
        return table
    return table.take(pc.sort_indices(table, sort_keys=[("trace_id", "ascending")]))


def _sorted(col: pa.ChunkedArray) -> bool:
    """Whether ``col`` is in ascending order (nulls, which trace ids never are, count as out of order)."""
    a = col.combine_chunks()
    return bool(pc.all(pc.less_equal(a.slice(0, len(a) - 1), a.slice(1)), skip_nulls=False).as_py())


def _write(data: Path, stats: BuildStats, chunk: int, traces: pa.Table, nodes: pa.Table, edges: pa.Table,
           label: str | None = None) -> None:
    stem = f"{stats.build_id}-{label or f'{chunk:04d}'}"
    # traces last: it is what makes the build of these traces visible
    for name, table in (("dag_nodes", nodes), ("dag_edges", edges), ("traces", traces)):
        with stage("write"):
            stats.files.append(str(write_parquet_atomic(by_trace(table), table_dir(data, name), stem,
                                                        row_group_size=TRACE_ROW_GROUP)))
        faults.hit(f"dag_build.after_{name}")
    stats.traces_built += traces.num_rows
    stats.spans += nodes.num_rows
    stats.nodes += nodes.num_rows
    stats.edges += edges.num_rows
    for count in pc.value_counts(traces.column("method")).to_pylist():
        stats.methods[count["values"]] = stats.methods.get(count["values"], 0) + count["counts"]
    stats.orphans += _total(traces.column("orphan_count"))
    stats.clock_skew += _total(traces.column("clock_skew_count"))
    stats.deviant += _total(pc.cast(pc.fill_null(traces.column("deviant"), False), pa.int64()))


def _total(col: pa.ChunkedArray) -> int:
    return int(pc.sum(col).as_py() or 0)


@contextmanager
def _spans_bar(show: bool, total: int) -> Iterator[Callback]:
    """``advance(spans)`` on one bar of ``total`` spans that stays when the build ends."""
    with bars(show, transient=False) as advance:
        advance(_BAR, 0, total)
        yield lambda n: advance(_BAR, n, None)

