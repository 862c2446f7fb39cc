"""One derived table's collection: delete dead files, then rewrite/merge into a staging copy and swap it in.

See ``tracedag.pipeline.store.gc`` for the rules; this module does the file work of one table.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tracedag.collector import faults
from tracedag.pipeline.store.compact import exchange
from tracedag.pipeline.store.gc import (
    PROTECTED,
    SCORED,
    TABLES,
    GcSettings,
    GcStats,
    Liveness,
    dead_share,
    live_mask,
    liveness,
    orphan_rows,
    remove_staging,
    staging_root,
    with_stored_rounds,
)
from tracedag.pipeline.store.parquet import parquet_options
from tracedag.schemas.fsio import file_lock, fsync_dir
from tracedag.schemas.layout import BUILD_LOCK, SCORE_LOCK, state_file, table_dir

if TYPE_CHECKING:
    import duckdb

logger = logging.getLogger(__name__)

ROW_GROUP = 16 * 1024
"""Rows per row group of the files a collection writes, sorted by trace id like a build's
(``dag.build.TRACE_ROW_GROUP``): a reader of one trace skips the row groups whose statistics do not hold it."""


def collect(data: Path, settings: GcSettings | None = None, compact: bool = False,
            con: duckdb.DuckDBPyConnection | None = None) -> GcStats:
    """Remove superseded rows (and merge small files) of every derived table; call inside the build lock.
    ``con``: a connection of the caller's over ``data`` to read the liveness on (``gc.liveness``), left open."""
    t0 = time.perf_counter()
    cfg = settings or GcSettings()
    stats = GcStats()
    remove_staging(data)
    lv = liveness(data, con)
    for table in TABLES:
        if table not in SCORED:
            collect_table(data, table, lv, cfg, compact, stats)
        elif table == SCORED[0]:
            collect_scored(data, lv, cfg, compact, stats)
    remove_staging(data)
    stats.seconds = round(time.perf_counter() - t0, 3)
    if stats.orphan_rows:
        logger.info("orphaned rounds (killed before their state rows): %d rows dropped (%s)",
                    sum(stats.orphan_rows.values()), stats.orphan_rows)
    return stats


def collect_scored(data: Path, lv: Liveness, cfg: GcSettings, compact: bool, stats: GcStats) -> None:
    """Collect the tables the scorer writes (``SCORED``) in one holding of its lock, or skip them all when a
    scorer holds it. The stored rounds are read once the lock is held, not with ``lv`` (computed before): a
    row of a round they do not name then belongs to a round that was killed (``gc`` module docstring)."""
    with file_lock(state_file(data, SCORE_LOCK), wait=False) as free:  # the scorer's lock (score.writes.score_lock)
        if not free:
            stats.skipped.extend(t for t in SCORED if table_dir(data, t).is_dir())
            return
        held = with_stored_rounds(lv, data)
        for table in SCORED:
            collect_table(data, table, held, cfg, compact, stats)


@dataclass
class TablePlan:
    """What to do with the files of one table that are not deleted outright (the others stay as they are)."""

    rewrite: list[Path] = field(default_factory=list)
    merge: list[Path] = field(default_factory=list)

    @property
    def swap_needed(self) -> bool:
        """Whether the table directory has to be replaced by a staged copy."""
        return bool(self.rewrite or self.merge)


def collect_table(data: Path, table: str, lv: Liveness, cfg: GcSettings, compact: bool, stats: GcStats) -> None:
    """Delete the dead files of ``table``, then rewrite mostly-dead ones and merge small ones if due."""
    for _, d, plan, _ in _plans(data, [table], lv, cfg, stats, compact):
        commit(prepare(staging_root(data), d, table, plan, lv, cfg), stats)


def collect_beside(data: Path, settings: GcSettings | None = None) -> GcStats:
    """``collect`` for a process whose builds and scorings go on meanwhile (the live collector): the dead files are
    deleted and every table's plan made under the scorer's lock and the build lock, as ``collect`` does (which skips
    the scored tables when a scorer runs; this waits for it); the new files are written with no lock held; the
    swaps are made under both locks again.

    A plan's files belong to builds and rounds that were complete when it was made (both locks held), and a row dead
    then stays dead (a later build only supersedes more), so the files written without the locks hold exactly the
    live rows of their inputs, or rows that died since (the next collection drops them). A file written meanwhile is
    no input: the swap links it into the new directory. A table whose inputs went away meanwhile (another
    collection, e.g. a ``tracedag build`` beside the collector) is left as it is."""
    t0 = time.perf_counter()
    cfg = settings or GcSettings()
    stats = GcStats()
    # the scorer's lock first, as a scoring round takes the build lock inside its own (``score.provenance``)
    with file_lock(state_file(data, SCORE_LOCK)), file_lock(state_file(data, BUILD_LOCK)):
        remove_staging(data)
        lv = liveness(data)
        plans = _plans(data, [t for t in TABLES if t not in SCORED], lv, cfg, stats)
        plans += _plans(data, list(SCORED), with_stored_rounds(lv, data), cfg, stats)
    root = staging_root(data) / f"beside-{os.getpid()}-{time.time_ns()}"
    # on the calling thread alone: the live collector's runs at a lower priority than its rounds
    staged = [prepare(root, d, table, plan, held, cfg, threads=False) for table, d, plan, held in plans]
    with file_lock(state_file(data, SCORE_LOCK)), file_lock(state_file(data, BUILD_LOCK)):
        for s in staged:  # in TABLES' order: traces last
            commit(s, stats)
    shutil.rmtree(root, ignore_errors=True)
    with contextlib.suppress(OSError):  # when empty: another collection may stage there meanwhile
        staging_root(data).rmdir()
    stats.seconds = round(time.perf_counter() - t0, 3)
    return stats


def _plans(data: Path, tables: list[str], lv: Liveness, cfg: GcSettings, stats: GcStats,
           compact: bool = False) -> list[tuple[str, Path, TablePlan, Liveness]]:
    """(table, its directory, its plan, the liveness it was made with) of every table of ``tables`` with a swap
    to make; every all-dead file deleted. A table without files, or partitioned (a layout this collector does not
    handle), has none."""
    out = []
    for table in tables:
        d = table_dir(data, table)
        if not d.is_dir() or any(p.is_dir() for p in d.iterdir()):
            continue
        plan = plan_table(d, table, lv, cfg, compact, stats)
        if plan.swap_needed:
            out.append((table, d, plan, lv))
    return out


def plan_table(d: Path, table: str, lv: Liveness, cfg: GcSettings, compact: bool, stats: GcStats) -> TablePlan:
    """Delete every all-dead file now; name the others to rewrite or merge (the rest stay: ``commit`` links them)."""
    plan = TablePlan()
    small: list[Path] = []
    deleted = 0
    for f in sorted(d.glob("*.parquet")):
        if f.name in PROTECTED:
            continue
        rows, dead, orphans = dead_share(f, table, lv, cfg.rewrite_share)
        if dead == rows:
            f.unlink()
            deleted += 1
            stats.add(stats.deleted, table, 1)
            stats.add(stats.rows_dropped, table, rows)
            stats.add(stats.orphan_rows, table, orphans)
            faults.hit("dag_gc.after_unlink")
            continue
        if rows - dead < cfg.small_rows:
            small.append(f)
        # a killed round's rows go whatever their share: nothing would ever make them dead enough later
        if dead > cfg.rewrite_share * rows or orphans:
            plan.rewrite.append(f)
    if len(small) > 1 and (compact or len(small) > cfg.max_small_files):
        plan.merge = small
        plan.rewrite = [f for f in plan.rewrite if f not in small]
    if deleted:
        fsync_dir(d)
    return plan


@dataclass
class Staged:
    """A table's new files written in staging (``prepare``), to be swapped in (``commit``)."""

    table: str
    d: Path
    stage: Path
    inputs: list[Path]  # the files the new ones replace
    rewritten: int
    merged: int
    written: int  # merged files written
    dropped: GcStats  # the rows the new files leave out, counted once swapped in


def prepare(root: Path, d: Path, table: str, plan: TablePlan, lv: Liveness, cfg: GcSettings,
            threads: bool = True) -> Staged:
    """Write the live rows of the files ``plan`` rewrites and merges into new files in ``root/table``; an input
    gone meanwhile (another collection took it, or removed the staging) leaves nothing staged, and ``commit`` then
    leaves the table.
    ``threads``: read with Arrow's thread pool (not: all the work on the calling thread, at its priority)."""
    stage = root / table
    stage.mkdir(parents=True)
    dropped = Dropped(GcStats(), table)
    merger = Merger(stage, cfg.target_rows, threads)
    try:
        for i, f in enumerate(plan.rewrite):
            # a new name, never the old one: a reader (or DuckDB's file cache) must never find other
            # content under a path it listed; it finds the old file or, after the swap, no file (re-run)
            _rewrite(f, stage / f"gc-{time.time_ns():020d}-{i:04d}.parquet", lv, dropped, threads)
        for f in plan.merge:
            merger.add(f, lv, dropped)
        merger.close()
    except FileNotFoundError:  # an input, or the staging a collection under the build lock removed meanwhile
        shutil.rmtree(stage, ignore_errors=True)
    return Staged(table, d, stage, [*plan.rewrite, *plan.merge], len(plan.rewrite), len(plan.merge), merger.count,
                  dropped.stats)


def commit(s: Staged, stats: GcStats) -> None:
    """Link every file of the table that is not an input beside the new ones, then exchange the two directories
    (call under the locks the plan was made under); a table whose inputs went away since is left as it is."""
    gone = [f for f in s.inputs if not f.exists()]
    if gone or not s.stage.is_dir():  # or its staging: a collection under the build lock removes what it finds
        logger.info("%s: %d of the files to collect went away meanwhile (another collection); left as it is",
                    s.table, len(gone))
        shutil.rmtree(s.stage, ignore_errors=True)
        return
    replaced = set(s.inputs)
    for f in sorted(s.d.glob("*.parquet")):
        if f not in replaced:
            os.link(f, s.stage / f.name)
    fsync_dir(s.stage)
    faults.hit("dag_gc.before_swap")
    exchange(s.stage, s.d)
    fsync_dir(s.d.parent)
    fsync_dir(s.stage.parent)
    faults.hit("dag_gc.after_swap")
    shutil.rmtree(s.stage)
    stats.add(stats.rewritten, s.table, s.rewritten)
    stats.add(stats.merged, s.table, s.merged)
    stats.add(stats.rows_dropped, s.table, s.dropped.rows_dropped.get(s.table, 0))
    stats.add(stats.orphan_rows, s.table, s.dropped.orphan_rows.get(s.table, 0))
    logger.info("%s: %d files rewritten, %d small files merged into %d", s.table, s.rewritten, s.merged, s.written)


@dataclass(frozen=True)
class Dropped:
    """Where the rows a rewrite or merge of one table's file drops are counted."""

    stats: GcStats
    table: str

    def live(self, t: pa.Table, lv: Liveness) -> pa.Table:
        """The live rows of ``t``; the others counted as dropped (and those of orphaned rounds as such)."""
        live = t.filter(live_mask(t, lv))
        self.stats.add(self.stats.rows_dropped, self.table, t.num_rows - live.num_rows)
        self.stats.add(self.stats.orphan_rows, self.table, orphan_rows(t, lv))
        return live


def _rewrite(src: Path, dst: Path, lv: Liveness, dropped: Dropped, threads: bool = True) -> None:
    """Write the live rows of ``src`` to ``dst`` (``threads``: read with Arrow's thread pool)."""
    live = dropped.live(pq.read_table(src, use_threads=threads), lv)
    if live.num_rows:
        _write(by_trace(live), dst)


def by_trace(t: pa.Table) -> pa.Table:
    """``t`` sorted by trace id (stable: a trace's rows keep their order)."""
    if t.num_rows < 2 or "trace_id" not in t.column_names:
        return t
    return t.take(pc.sort_indices(t, sort_keys=[("trace_id", "ascending")]))


def _write(t: pa.Table, path: Path) -> None:
    with pq.ParquetWriter(path, t.schema, **parquet_options(t)) as w:
        w.write_table(t, row_group_size=ROW_GROUP)
    _fsync(path)


def _fsync(path: Path) -> None:
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


class Merger:
    """Merges the live rows of small files into new files of about ``target_rows`` rows, each sorted by trace id.

    A file's rows are held until it is full (at most ``target_rows`` plus one input's): files merged in
    turn, each sorted, would otherwise give row groups spanning every trace id.
    """

    def __init__(self, out_dir: Path, target_rows: int, threads: bool = True) -> None:
        self.out_dir = out_dir
        self.target_rows = target_rows
        self.threads = threads
        self.count = 0
        self._held: list[pa.Table] = []
        self._rows = 0

    def add(self, f: Path, lv: Liveness, dropped: Dropped) -> None:
        """Append the live rows of ``f``."""
        live = dropped.live(pq.read_table(f, use_threads=self.threads), lv)
        if live.num_rows:
            self._append(live)

    def _append(self, t: pa.Table) -> None:
        if self._held and (self._rows >= self.target_rows or not self._held[0].schema.equals(t.schema)):
            self._finish()
        self._held.append(t)
        self._rows += t.num_rows

    def _finish(self) -> None:
        if not self._held:
            return
        path = self.out_dir / f"compact-{time.time_ns():020d}-{self.count:04d}.parquet"
        self.count += 1
        _write(by_trace(pa.concat_tables(self._held)), path)
        self._held, self._rows = [], 0

    def close(self) -> None:
        """Write the last output file."""
        self._finish()
