"""A live collector's store of the named queries' results, off its round loop (``service``, issue #31).

``score.materialize`` stores a round's results in one holding of the scorer's lock on a connection of its own:
a fixed ~2 s of CPU whatever the round's size (connect and bind the macros ~0.5 s, make the failure-graph macros
again and keep the graph ~0.4 s, plan the six queries ~0.8 s), and inside the live round loop it held every
later trace back. ``LiveStore`` cuts one pass into three steps so that a thread of its own runs it beside the
loop (DuckDB releases the GIL: the second core) and holds the locks only for what must be consistent:

1. ``copy`` (the caller holds the round loop between rounds, so every build is scored, and the scorer's lock):
   the state rows of the first part (``part`` traces, whole conversations) of the traces whose latest build has
   no stored round, and a copy of those traces' rows of the tables the rounds write (``traces``, ``dag_nodes``,
   ``dag_edges``, ``step_scores``). The state rows name exactly the builds copied and the round.
   ``copy_spans`` (no lock): those traces' spans. Only the converter writes spans, never a round, so the round
   lock guards nothing of them; copied under it, they were ~2/3 of the time the rounds were held (0.65 of 1.0 s
   of CPU for a part of 4,500 traces), and a converter may add spans during either copy alike (the refined views
   take what a trace has, as over the whole store). A compaction that swapped a file away makes it run again.
2. ``compute`` (no lock): the six results over the copy, as Arrow tables.
3. ``write`` (the scorer's lock, as every round writes: ``store.gc``'s argument that a collection never drops a
   round in flight holds): each result's file, then the state file.

A pass that stops between 1 and 3 writes nothing: its traces stay without state rows, the next pass (or the
next collector) stores them. A pass killed inside 3 leaves rows no state names, which a collection drops.

One connection is kept from pass to pass (views and shared macros bound once, the failure-graph originals kept
under their own names: ``sharedgraph.keep_originals``); each pass makes the refined views read the store again,
and the views of every table again when a derived table appeared or the store is an object store (its views list
files). When the SQL or the human labels changed since the newest stored round, ``copy`` says so (``Copied.full``)
and the caller stores every trace again with ``materialize`` (the state of all its parts in one file).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pyarrow as pa

from tracedag.pipeline.score import materialize as m
from tracedag.pipeline.score import sharedgraph
from tracedag.pipeline.score.live_waiting import Waiting
from tracedag.pipeline.score.memory import memory_limit
from tracedag.pipeline.store import freshness
from tracedag.pipeline.store import materialized as mat
from tracedag.pipeline.store.files import parquet_files, rerun_if_vanished
from tracedag.pipeline.store.remote import remote_of
from tracedag.pipeline.store.views import _LATEST, SCHEMAS, _derived_tables, connect, create_views

logger = logging.getLogger(__name__)

CONVERTED = ("spans",)
"""The tables of the refined views that only the converter writes (``copy_spans``); the rounds write the others."""


@dataclass(frozen=True)
class Copied:
    """What ``copy`` took: the state rows of the part copied (trace, build copied, round, signature), whether more
    traces wait, or ``full``: the SQL or labels changed, every trace is stored again (``materialize``)."""

    state: pa.Table | None = None
    more: bool = False
    full: bool = False

    @property
    def traces(self) -> int:
        """Traces copied."""
        return 0 if self.state is None else int(self.state.num_rows)


@dataclass
class Results:
    """``compute``'s rows of each stored query (name, per, rows)."""

    rows: list[tuple[str, str | None, pa.Table]] = field(default_factory=list)


class LiveStore:
    """The named queries' results of the scored traces not stored yet, a part a pass, on one kept connection."""

    def __init__(self, data: Path, part: int, memory: int | None = None) -> None:
        self.data, self.part, self.memory = data, part, memory
        self._con: duckdb.DuckDBPyConnection | None = None
        self._derived: list[str] = []
        self._empty: set[str] = set()  # core tables without files when the views were made (an empty relation)
        self._shared = False
        self._spill = data / "state" / f"duckdb-spill-live-{id(self):x}"
        self._waiting = Waiting(data)  # the traces waiting, from what changed since the last pass

    def _connection(self) -> duckdb.DuckDBPyConnection:
        if self._con is None:
            self._spill.mkdir(parents=True, exist_ok=True)
            con = connect(self.data, private=True)  # its memory limit and spill directory
            limit = memory_limit() if self.memory is None else self.memory
            if limit is not None:
                con.execute(f"set memory_limit = '{int(limit) // 2**20}MiB'")
            con.execute(f"set temp_directory = '{str(self._spill).replace(chr(39), chr(39) * 2)}'")
            con.execute("set enable_progress_bar = false")
            self._shared = sharedgraph.keep_originals(con)
            self._con = con
            self._made_views()
        return self._con

    def _made_views(self) -> None:
        self._derived = _derived_tables(self.data)
        self._empty = {t for t in SCHEMAS if not parquet_files(self.data, t)}

    def _fresh_views(self, con: duckdb.DuckDBPyConnection) -> None:
        """The refined views over the raw tables again (the last pass pointed them at its copy); every view again
        when the derived tables changed, a core table that had no files has some (its view was an empty relation)
        or the store is an object store (its views list files)."""
        if (_derived_tables(self.data) != self._derived or any(parquet_files(self.data, t) for t in self._empty)
                or remote_of(self.data) is not None):
            create_views(con, self.data, shared_macros=False)
            self._made_views()
            return
        con.execute(";\n".join(f"create or replace view {table} as {body}" for table, body in _LATEST.items()))

    def copy(self) -> Copied:
        """Step 1, under the round loop's lock (every build scored) and the scorer's lock: the first part of the
        traces waiting, copied (``Copied.state`` None: none waits)."""
        con = self._connection()
        self._fresh_views(con)
        signature = mat.signature(self.data)
        first = not freshness.has_state_view(con)  # nothing stored yet: every trace waits, stored a part at a time
        if not first and m._signature_changed(con, signature):
            return Copied(full=True)
        scope = m._every_trace(con) if first else self._waiting.traces(con)
        if scope.num_rows == 0:
            return Copied()
        con.register(m.SCOPE, scope)
        parts = m._chunks(self._waiting.state(con, signature), self.part)
        part = parts[0].set_column(parts[0].schema.get_field_index("mat_round"), "mat_round",
                                   pa.array([time.time_ns()] * parts[0].num_rows, pa.int64()))
        con.register(m.SCOPE + "_all", part.select(["trace_id"]))
        m._snapshot(con, self.data, [t for t in _LATEST if t not in CONVERTED])
        return Copied(part, more=len(parts) > 1)

    def copy_spans(self, copied: Copied) -> None:
        """Step 1b, without a lock: the spans of the part ``copy`` took (run again when a compaction swapped a file
        away under it)."""
        assert copied.state is not None
        con = self._connection()
        rerun_if_vanished(lambda: m._snapshot(con, self.data, CONVERTED))

    def compute(self, copied: Copied) -> Results:
        """Step 2, without a lock, after ``copy_spans``: every stored query's rows over the copy (the failure graph
        computed once)."""
        assert copied.state is not None
        con = self._connection()
        round_ns = int(copied.state.column("mat_round")[0].as_py())
        con.register("__tracedag_mat_builds", copied.state.select(["trace_id", "build_id"]))
        if self._shared:
            sharedgraph.reshare(con)
        return Results(list(m.stored_rows(con, round_ns, alone=m.one_turn_each(copied.state))))

    def write(self, copied: Copied, results: Results) -> m.MaterializeStats:
        """Step 3, under the scorer's lock: each result's file, then the state rows (the round is visible then)."""
        assert copied.state is not None
        stats = m.MaterializeStats(traces=copied.traces)
        for name, per, rows in results.rows:
            label = m._label(name, per)
            stats.rows[label] = stats.rows.get(label, 0) + m.write_rows(self.data, name, rows)
        m._write_state(self.data, copied.state)
        return stats

    def interrupt(self) -> None:
        """Stop the statement running on the kept connection (a collector stopping); it raises there."""
        con = self._con
        if con is not None:
            with contextlib.suppress(duckdb.Error):  # closed meanwhile: nothing runs
                con.interrupt()

    def close(self) -> None:
        """Close the kept connection (the next pass makes another) and remove its spill directory."""
        if self._con is not None:
            con, self._con = self._con, None
            con.close()
        shutil.rmtree(self._spill, ignore_errors=True)
