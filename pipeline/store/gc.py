"""Garbage collection of superseded builds and compaction of the small derived files.

Every build writes new ``traces``/``dag_nodes``/``dag_edges`` files; the views show only the latest
build of each trace (the arg_max row of ``traces_all``), so rows of older builds are dead weight.
A row is *live* when its ``(trace_id, build_id)`` is the latest build of its trace (``step_scores``
rows with a null ``build_id``, the human labels, are always live). After a build, inside the build
lock, ``swap.collect`` (step_scores also inside the scorer's lock, skipped while a scorer runs):

1. deletes every file whose rows are all dead (after a full rebuild: every older file; known from
   the Parquet statistics of ``build_id`` and per-build counts of ``traces_all``, no file read);
2. builds the new state of a table directory in ``<data>/state/dag-gc/<table>/`` when some file is
   mostly dead (rewritten without its dead rows, new name) or when the table has too many small
   files (merged, dead rows dropped, fresh names); the other files are hard-linked; then swaps the
   staging and table directories with one ``renameat2(RENAME_EXCHANGE)`` (``compact.exchange``, the
   spans compaction's mechanism), so a reader listing the table sees all old or all new files.

Live rows are never removed and never duplicated: rewritten and merged files get new names that
appear in the same swap that removes their inputs, and no path ever gets other content (a reader
that listed the old files may find one gone: the query layer re-runs it). A crash leaves each table
either old or new; staging left-overs are removed on the next
run, and ``state/build-inflight`` names a build that crashed midway, whose chunk files without a
``traces`` file are deleted before the next build.

**Rounds killed before their state rows** (``stored_rounds``). A scoring round writes the named queries' rows
(``materialized_<query>``, each row with its ``mat_round``), then, last, its ``materialized_traces`` rows; readers
join on those, so the rows of a round killed between the two (SIGKILL, OOM, or an error ``runner._materialize``
logs and swallows) are never read, and nothing else would ever remove them: the collection drops every row
whose round no state row names. That never drops a round that completes, by this argument:

1. Every round writes its rows and then its state while holding the scorer's lock (``runner.score_store``,
   ``runner.materialize_later``, ``score.live_store``); the kernel releases an ``flock`` when its holder dies.
2. ``swap.collect_scored`` takes that lock (or skips every scored table), and only then reads the rounds the
   state files name and lists the result files, and it collects every scored table within that one holding.
   While it holds the lock no round is in flight: a round whose rows are in a result table has either written
   its state (its round is in the set just read) or ended without writing it, and will never write it.
3. Nothing computed before the lock decides it: ``liveness`` (the live builds, the replaced rounds) is read
   before, and a round that completes between the two is in the set read under the lock, so its rows stay
   (``tests/store/test_orphan_rounds.py`` runs a real round in that window).
4. A round in parts (``materialize(..., part=...)``) gives each part its own ``mat_round``: each part's state
   lands with it (the store's first round), or every part's in one file after the last (a round of every
   trace after the SQL or labels changed). Killed before that file, every part's rows are orphaned; killed
   between parts, the parts without state are; a part whose state was written stays.

A round number is the writer's ``time.time_ns()``: were a killed round's number ever that of a stored round,
its rows would stay (never the other way). State files without a ``mat_round`` column (an older layout) make
the set unknown, and then nothing is dropped for this reason.
"""

from __future__ import annotations

import functools
import logging
import shutil
import time
from contextlib import closing
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tracedag.pipeline.store import freshness, materialized
from tracedag.pipeline.store.hashes import key_hashes, within
from tracedag.schemas.fsio import fsync_dir
from tracedag.schemas.layout import build_inflight_dir, dag_gc_dir, spool_done_dir, table_dir

if TYPE_CHECKING:
    import duckdb

logger = logging.getLogger(__name__)

SCORED = ("step_scores", *(materialized.table_name(n) for n in materialized.SPECS), materialized.STATE)
"""Tables the scorer writes: collected only while no scorer runs (its lock)."""
ROUNDS = frozenset({*(materialized.table_name(n) for n in materialized.SPECS), materialized.STATE})
"""Tables whose rows carry the round that wrote them (``mat_round``)."""
TABLES = ("dag_nodes", "dag_edges", *SCORED, "traces")
"""Collected in this order: ``traces`` last, so that a crash never loses which builds are known."""

PROTECTED = frozenset({"human.parquet", f"{materialized.SCHEMA_STEM}.parquet"})
"""``step_scores/human.parquet`` is rewritten in place by the label import: never merged away; a
materialized table's ``schema.parquet`` (no rows) keeps its view in place."""


@dataclass(frozen=True)
class GcSettings:
    """When to rewrite and when to compact."""

    rewrite_share: float = 0.5  # rewrite a file when more than this share of its rows is dead
    small_rows: int = 100_000  # a file with fewer rows is small
    max_small_files: int = 16  # compact a table when it has more small files than this
    target_rows: int = 500_000  # rows per merged file
    enabled: bool = True  # False: builds leave superseded rows in place (``collect`` still works when called)


@dataclass
class GcStats:
    """What one collection did, per table."""

    deleted: dict[str, int] = field(default_factory=dict)
    rewritten: dict[str, int] = field(default_factory=dict)
    merged: dict[str, int] = field(default_factory=dict)  # small files merged
    rows_dropped: dict[str, int] = field(default_factory=dict)
    orphan_rows: dict[str, int] = field(default_factory=dict)  # of rows_dropped: of rounds with no state row
    skipped: list[str] = field(default_factory=list)  # tables left alone (a scorer held its lock)
    seconds: float = 0.0

    def add(self, what: dict[str, int], table: str, n: int) -> None:
        """Add ``n`` to ``what[table]``."""
        if n:
            what[table] = what.get(table, 0) + n


ROWS_PER_SPAN = {"dag_nodes": 1, "dag_edges": 3}
"""Rows per span of a trace, at most (edges: parent + sequence + explicit, with room), to bound the
dead rows of a file from per-build span counts without reading it."""

_PAIRS_SQL = "select trace_id, build_id, built_unix_nano, span_count from traces_all"
"""What ``liveness`` reads: every (trace, build) row of ``traces_all``, four narrow columns (the build writes them
all, never null); the latest build of each trace (the ``traces`` view's arg_max) is then found with one sort."""


@dataclass(frozen=True)
class Liveness:
    """Which (trace, build) pairs are live, and per build how many of its traces are."""

    keys: pa.Array  # "trace_id\x1fbuild_id" of every live pair
    total: dict[str, int]  # build -> traces rows in traces_all
    live: dict[str, int]  # build -> live traces rows
    dead_spans: dict[str, int] = field(default_factory=dict)  # build -> spans of its superseded traces
    replaced: pa.Array | None = None  # "trace_id\x1fbuild_id\x1fmat_round": stored rounds a later one of the pair replaced
    stale_rounds: frozenset[int] = frozenset()  # the rounds among those
    stored_rounds: frozenset[int] | None = None  # rounds the state names, read under the scorer's lock (None: unknown)
    stored_array: pa.Array | None = None  # the same, as an int64 array
    @functools.cached_property
    def key_hashes(self) -> np.ndarray:
        """``keys`` hashed (``key_hashes``) and sorted, once (``holds``)."""
        return np.sort(key_hashes(self.keys), kind="stable")  # a radix sort: 64-bit values

    def holds(self, keys: pa.Array) -> np.ndarray:
        """Per key of ``keys`` (as ``self.keys`` spells them): whether it may be a live pair. Every live pair is; a
        dead pair whose 64-bit hash is a live pair's would be too (its row then kept: readers never show it).

        ``pc.is_in(keys, value_set=self.keys)`` hashed every live pair of the store again at each call, and the
        collection calls it for every file it rewrites or merges: on 870k traces 0.24 s CPU a file, against
        3 ms with the hashes made once (0.2 s) and searched (``bench/gc_live.py``)."""
        return within(key_hashes(keys), self.key_hashes)

    def orphans(self, rounds: list[int]) -> set[int]:
        """Those of ``rounds`` no state row names (rounds killed before their state rows); none when unknown."""
        return set() if self.stored_rounds is None else set(rounds) - self.stored_rounds

    def dead_bound(self, table: str, build: str) -> int | None:
        """At most this many rows of ``build`` in ``table`` are dead (None: no bound known)."""
        if table == "traces":
            return self.total.get(build, 0) - self.live.get(build, 0)
        per_span = ROWS_PER_SPAN.get(table)
        return None if per_span is None else per_span * self.dead_spans.get(build, 0)

    def status(self, build: str) -> str:
        """``dead`` (no live trace), ``live`` (every trace live) or ``mixed``."""
        live = self.live.get(build, 0)
        if live == 0:
            return "dead"
        return "live" if live == self.total.get(build, 0) else "mixed"


def liveness(data: Path, con: duckdb.DuckDBPyConnection | None = None) -> Liveness:
    """Read the live pairs and per-build counts from the ``traces`` views: on ``con`` (a connection over ``data``
    whose raw views of ``traces`` and the stored rounds' state are made again here, left open) or a new one."""
    pairs, replaced, stale = _read_liveness(data, con) if con is not None else (None, None, frozenset())
    if pairs is None:
        from tracedag.pipeline.store.views import connect  # DuckDB: not in the converters, which only prune

        # reads traces_all and the stored rounds' state only: their raw views, not every view and macro
        with closing(connect(data, tables=["traces", materialized.STATE], private=True)) as own:  # threads = 1
            pairs, replaced, stale = _read_liveness(data, own)
        assert pairs is not None
    live, per_build = latest_builds(pairs)
    return Liveness(keys=live, total=per_build["total"], live=per_build["live"], dead_spans=per_build["dead_spans"],
                    replaced=replaced, stale_rounds=stale)


def _read_liveness(data: Path, con: duckdb.DuckDBPyConnection) -> tuple[
        pa.Table | None, pa.Array | None, frozenset[int]]:
    """``_PAIRS_SQL`` and ``_replaced`` on ``con``, its raw views of the two tables made again first (the files
    now); (None, None, empty) when a file went away meanwhile (``liveness`` then connects afresh, which lists again)."""
    import duckdb  # not at the top: the converters import this module, and only prune

    from tracedag.pipeline.store.views import create_raw_views

    try:
        create_raw_views(con, data, ["traces", materialized.STATE])
        # one thread: narrow reads of a few thousand rows a file, where DuckDB's other threads only add CPU
        con.execute("set threads = 1; set enable_progress_bar = false")
        pairs = con.sql(_PAIRS_SQL).to_arrow_table()
        replaced, stale = _replaced(con)
    except duckdb.IOException:
        return None, None, frozenset()
    return pairs, replaced, stale


def latest_builds(pairs: pa.Table) -> tuple[pa.Array, dict[str, dict[str, int]]]:
    """The keys ``trace_id\x1fbuild_id`` of each trace's latest build in ``pairs`` (``_PAIRS_SQL``: the greatest
    (built_unix_nano, build_id), as the ``traces`` view's arg_max), and per build: ``total`` rows, ``live`` rows
    (of a trace's latest build) and ``dead_spans`` (``span_count`` of the others)."""
    order = pc.sort_indices(pairs, sort_keys=[("trace_id", "ascending"), ("built_unix_nano", "descending"),
                                              ("build_id", "descending")])
    t = pairs.take(order)
    trace = t.column("trace_id").combine_chunks()
    build = t.column("build_id").combine_chunks()
    n = len(t)
    first = np.ones(n, dtype=np.bool_)  # the first row of each trace's run: its latest build
    if n > 1:
        first[1:] = pc.not_equal(trace.slice(1), trace.slice(0, n - 1)).to_numpy(zero_copy_only=False)
    run = np.cumsum(first) - 1  # each row's trace, as the index of its run
    heads = np.flatnonzero(first)
    latest = build.take(pa.array(heads))
    is_live = pc.equal(build, latest.take(pa.array(run))).to_numpy(zero_copy_only=False) if n else first
    spans = np.asarray(t.column("span_count").to_numpy(zero_copy_only=False), dtype=np.int64)
    per = pa.table({"b": build, "live": pa.array(is_live.astype(np.int64)),
                    "dead": pa.array(np.where(is_live, 0, spans))}).group_by("b").aggregate(
        [("b", "count"), ("live", "sum"), ("dead", "sum")])
    names = per.column("b").to_pylist()
    counts = {k: per.column(c).to_pylist() for k, c in (("total", "b_count"), ("live", "live_sum"),
                                                          ("dead_spans", "dead_sum"))}
    keys = pc.binary_join_element_wise(trace.take(pa.array(heads)), latest, "\x1f")
    return keys, {k: {b: int(v) for b, v in zip(names, vs, strict=True)} for k, vs in counts.items()}


_REPLACED_SQL = f"""
select trace_id, build_id, mat_round from (
    select trace_id, build_id, mat_round, max(mat_round) over (partition by trace_id, build_id) as newest
    from {materialized.STATE}
) where mat_round < newest
"""
"""The stored rounds of a (trace, build) older than its newest (readers take the newest, ``store.materialized``)."""


def _replaced(con: duckdb.DuckDBPyConnection) -> tuple[pa.Array | None, frozenset[int]]:
    """The (trace, build, round) keys of the stored rounds a later round of the same pair replaced (a later turn of
    the conversation, new SQL or labels), whose rows are dead, and those rounds. Only what the state rows say
    now: a round stored after this (a scorer may run before the collection takes its lock) is not in it, so its
    rows and those it replaces stay until the next collection. (None, empty) when nothing is stored."""
    if not freshness.has_state_view(con):
        return None, frozenset()
    old = con.sql(_REPLACED_SQL).to_arrow_table()
    text = pc.cast(old.column("mat_round"), pa.string())
    keys = pc.binary_join_element_wise(old.column("trace_id"), old.column("build_id"), text, "\x1f")
    return keys.combine_chunks(), frozenset(pc.unique(old.column("mat_round")).to_pylist())


def stored_rounds(data: Path) -> frozenset[int] | None:
    """The rounds the state files of ``data`` name now, or None when some file has no ``mat_round`` (an older
    layout). Call it holding the scorer's lock (module docstring: then no round is in flight)."""
    rounds: set[int] = set()
    d = table_dir(data, materialized.STATE)
    if d.is_dir() and any(p.is_dir() for p in d.iterdir()):
        return None  # a partitioned layout this collector does not read
    for f in d.glob("*.parquet"):
        found = _file_rounds(f)
        if found is None and f.name not in PROTECTED:
            return None
        rounds.update(found or ())
    return frozenset(rounds)


def with_stored_rounds(lv: Liveness, data: Path) -> Liveness:
    """``lv`` knowing the stored rounds of ``data`` (read now: call it holding the scorer's lock)."""
    stored = stored_rounds(data)
    array = None if stored is None else pa.array(sorted(stored), pa.int64())
    return replace(lv, stored_rounds=stored, stored_array=array)


def orphan_rows(table: pa.Table, lv: Liveness) -> int:
    """Rows of ``table`` whose round no state row names (0 without ``mat_round`` or when the rounds are unknown)."""
    if lv.stored_array is None or "mat_round" not in table.column_names:
        return 0
    stored = pc.fill_null(pc.is_in(table.column("mat_round"), value_set=lv.stored_array), True)
    return int(table.num_rows - (pc.sum(stored).as_py() or 0))


def single_build(path: Path, meta: pq.FileMetaData | None = None) -> str | None:
    """The one ``build_id`` of every row of ``path`` per its statistics, or None (several, nulls, unknown);
    ``meta``: its metadata, when read already."""
    meta = pq.ParquetFile(path).metadata if meta is None else meta
    col = meta.schema.names.index("build_id") if "build_id" in meta.schema.names else -1
    if col < 0:
        return None
    seen: set[str] = set()
    for g in range(meta.num_row_groups):
        st = meta.row_group(g).column(col).statistics
        if st is None or not st.has_min_max or st.null_count or st.min != st.max:
            return None
        seen.add(st.min if isinstance(st.min, str) else bytes(st.min).decode())
    return seen.pop() if len(seen) == 1 else None


def live_mask(table: pa.Table, lv: Liveness) -> pa.Array:
    """Per row of ``table``: whether it is live (a materialized table's row: and not of a replaced round). A dead
    row is kept when its pair hashes as a live one (``Liveness.holds``), never a live row dropped."""
    keys = pc.binary_join_element_wise(table.column("trace_id"), table.column("build_id"), "\x1f")
    live = pc.or_(pa.array(lv.holds(keys)), pc.is_null(table.column("build_id")))
    if lv.replaced is not None and len(lv.replaced) and "mat_round" in table.column_names:
        text = pc.cast(table.column("mat_round"), pa.string())
        old = pc.is_in(pc.binary_join_element_wise(keys, text, "\x1f"), value_set=lv.replaced)
        live = pc.and_(live, pc.invert(pc.fill_null(old, False)))
    if lv.stored_array is not None and "mat_round" in table.column_names:  # a round killed before its state rows
        live = pc.and_(live, pc.fill_null(pc.is_in(table.column("mat_round"), value_set=lv.stored_array), True))
    return live.combine_chunks()


def dead_share(path: Path, table: str, lv: Liveness, rewrite_share: float) -> tuple[int, int, int]:
    """(rows, dead rows, rows of orphaned rounds among them) of ``path``: from the statistics when it holds one
    build, from its build ids when every one of them is wholly live or wholly dead; else the file's keys are read.

    A file of one partly superseded build is not read when even all of the build's dead rows could
    not make up ``rewrite_share`` of it (its dead rows are then reported as 0: it stays as it is).
    A file holding rows of a round no state row names (``lv.orphans``) is read, unless that is every round of it.
    """
    rows, build = footer(path)
    rounds = rounds_of(path) if table in ROUNDS else []
    orphans = lv.orphans(rounds)
    if orphans and len(orphans) == len(rounds):
        return rows, rows, rows  # every round of the file was killed before its state rows
    replaced = bool(lv.stale_rounds.intersection(rounds))  # a later round's
    if not orphans:
        dead = _dead_unread(path, rows, build, table, lv, rewrite_share, replaced)
        if dead is not None:
            return rows, dead, 0
    columns = ["trace_id", "build_id", *(["mat_round"] if replaced or orphans else [])]
    t = pq.read_table(path, columns=columns)
    return rows, rows - int(pc.sum(live_mask(t, lv)).as_py() or 0), orphan_rows(t, lv)


def _dead_unread(path: Path, rows: int, build: str | None, table: str, lv: Liveness, rewrite_share: float,
                 replaced: bool) -> int | None:
    """The dead rows of ``path`` (``rows`` rows, all of ``build`` per ``footer``) known without reading it
    (``dead_share``), or None."""
    if build is not None:
        state = lv.status(build)
        if state == "dead" or (state == "live" and not replaced):
            return rows if state == "dead" else 0
        bound = lv.dead_bound(table, build)
        if bound is not None and bound <= rewrite_share * rows and not replaced:
            return 0
        return None
    states = {lv.status(b) if b is not None else "live" for b in builds_of(path)}
    if states == {"dead"} or (states == {"live"} and not replaced):  # several builds (scores, merged files)
        return rows if states == {"dead"} else 0
    return None


_FOOTERS: dict[tuple[str, int, int], tuple[int, str | None]] = {}
"""(path, size, mtime) -> (rows, ``single_build``) of a file, from its footer (as ``_BUILDS_SEEN``): a live builder
collects after every round, and reading every footer of every derived table each time costs ~0.6 ms a file."""


def footer(path: Path) -> tuple[int, str | None]:
    """The rows of ``path`` and its one build per its statistics (``single_build``), read once per version."""
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _FOOTERS:
        if len(_FOOTERS) > 10_000:
            _FOOTERS.clear()
        meta = pq.ParquetFile(path).metadata
        _FOOTERS[key] = (meta.num_rows, single_build(path, meta))
    return _FOOTERS[key]


_BUILDS_SEEN: dict[tuple[str, int, int], list[str | None]] = {}
"""(path, size, mtime) -> the distinct build ids of a file: files never change in place, so a
long-running builder (``collect --build``) reads each file's build ids once."""


def builds_of(path: Path) -> list[str | None]:
    """The distinct ``build_id`` values of ``path`` (None for rows without one)."""
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _BUILDS_SEEN:
        if len(_BUILDS_SEEN) > 10_000:
            _BUILDS_SEEN.clear()  # stale versions of deleted or rewritten files
        col = pq.read_table(path, columns=["build_id"]).column("build_id")
        _BUILDS_SEEN[key] = pc.unique(col.combine_chunks()).to_pylist()
    return _BUILDS_SEEN[key]


_ROUNDS_SEEN: dict[tuple[str, int, int], list[int] | None] = {}
"""(path, size, mtime) -> the distinct ``mat_round`` values of a materialized table's file (as ``_BUILDS_SEEN``)."""


def rounds_of(path: Path, meta: pq.FileMetaData | None = None) -> list[int]:
    """The distinct stored rounds (``mat_round``) of ``path``; [] for a file without that column. ``meta``: its
    metadata, when read already."""
    return _file_rounds(path, meta) or []


def _file_rounds(path: Path, meta: pq.FileMetaData | None = None) -> list[int] | None:
    """The distinct rounds of ``path``, None without a ``mat_round`` column. From the statistics when each row
    group holds one round (a round's own file), else from the column; once per version of a file."""
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _ROUNDS_SEEN:
        if len(_ROUNDS_SEEN) > 10_000:
            _ROUNDS_SEEN.clear()
        meta = pq.ParquetFile(path).metadata if meta is None else meta
        col = next((i for i in range(meta.num_columns) if meta.schema.column(i).path == "mat_round"), -1)
        found = None if col < 0 else _rounds_by_statistics(meta, col)
        if found is None and col >= 0:
            read = pq.read_table(path, columns=["mat_round"]).column("mat_round")
            found = [r for r in pc.unique(read.combine_chunks()).to_pylist() if r is not None]
        _ROUNDS_SEEN[key] = found
    return _ROUNDS_SEEN[key]


def _rounds_by_statistics(meta: pq.FileMetaData, col: int) -> list[int] | None:
    """The rounds of a file (``mat_round`` its column ``col``) when its statistics tell, else None."""
    seen: set[int] = set()
    for g in range(meta.num_row_groups):
        st = meta.row_group(g).column(col).statistics
        if meta.row_group(g).num_rows == 0:
            continue
        if st is None or not st.has_min_max or st.null_count or st.min != st.max:
            return None
        seen.add(int(st.min))
    return sorted(seen)


def staging_root(data: Path) -> Path:
    """``<data>/state/dag-gc``: where the new state of a table directory is built."""
    return Path(dag_gc_dir(data))


def remove_staging(data: Path) -> None:
    """Remove staging directories a crash left (the tables themselves are complete)."""
    if staging_root(data).exists():
        shutil.rmtree(staging_root(data))


def inflight_path(data: Path) -> Path:
    """``state/build-inflight``: the id of the build writing files now."""
    return Path(build_inflight_dir(data))


def mark_inflight(data: Path, build_id: str | None) -> None:
    """Record (or clear, with None) the build whose files are being written."""
    path = inflight_path(data)
    if build_id is None:
        path.unlink(missing_ok=True)
        return
    path.write_text(build_id, encoding="utf-8")
    fsync_dir(path.parent)


def remove_crashed_build(data: Path) -> int:
    """Delete the chunk files of a build that crashed before writing their ``traces`` file."""
    path = inflight_path(data)
    if not path.exists():
        return 0
    build = path.read_text(encoding="utf-8").strip()
    removed = 0
    for table in ("dag_nodes", "dag_edges", "traces") if build else ():
        for f in table_dir(data, table).glob(f"{build}-*.parquet*"):
            if f.name.endswith(".tmp") or not (table_dir(data, "traces") / f.name).exists():
                f.unlink()
                removed += 1
    mark_inflight(data, None)
    if removed:
        logger.info("removed %d files of crashed build %s", removed, build)
    return removed


def prune_spool_done(data: Path, retention: float, now_unix: float | None = None) -> int:
    """Delete converted segments older than ``retention`` seconds from ``spool/done/``; return how many."""
    limit = (time.time() if now_unix is None else now_unix) - retention
    pruned = 0
    for seg in spool_done_dir(data).glob("seg-*"):
        try:
            if seg.stat().st_mtime < limit:
                seg.unlink()
                pruned += 1
        except FileNotFoundError:
            continue
    return pruned
