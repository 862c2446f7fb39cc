"""Materialize at score time: the named queries' default results of the traces just scored, as tables.

After a ``score_store`` run (and each live round's), the traces whose latest build has no
``materialized_traces`` row yet, and those that got score rows in this run, are taken with every
other trace of their conversations (a later turn changes the earlier turns' ``turn_index`` and the
conversation's root cause). On a connection whose refined views (``traces``, ``spans``, ``dag_nodes``,
``dag_edges``, ``step_scores``) read a temporary copy of only those traces' rows (a backlog in parts of
``CHUNK_TRACES`` traces), each materialized named query runs with its default parameters (``root_causes`` per trace and per
conversation), exactly as ``tracedag query`` would run it; its rows are written to
``tables/materialized_<query>/`` with the trace's ``build_id`` and the round, then one
``materialized_traces`` row per trace makes the round visible (``store.materialized`` reads them).
When the SQL definitions or the human labels changed since the newest round, every trace is
materialized again.
"""

from __future__ import annotations

import functools
import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tracedag import queries
from tracedag.pipeline.score.memory import bound, bounded_connection, memory_limit
from tracedag.pipeline.score.sharedgraph import across_turns, shared_failure_graph
from tracedag.pipeline.store import current_rounds, freshness
from tracedag.pipeline.store import materialized as mat
from tracedag.pipeline.store.fetch import arrow
from tracedag.pipeline.store.latest import LATEST_BUILDS_SQL, LATEST_CONVERSATIONS_SQL
from tracedag.pipeline.store.mixed import narrowed
from tracedag.pipeline.store.parquet import write_parquet_atomic
from tracedag.pipeline.store.querying import bind_params
from tracedag.pipeline.store.shared_macros import create_shared_macros, needed_shared_macros
from tracedag.pipeline.store.views import _LATEST, forget_views, own_view, refresh_views
from tracedag.schemas.layout import table_dir

logger = logging.getLogger(__name__)

SCOPE = "__tracedag_mat_scope"
SNAPSHOT = "__tracedag_mat_copy_"
CHUNK_TRACES = 20_000
"""Traces (whole conversations) materialized over one copy of their rows: a backlog of a live collector is
stored in parts of this size (each costs the queries' planning once, its copy stays small)."""
PART_TRACES = 100_000
"""A round of every trace is cut into parts of this many traces when the store has more: storing the results of
a 10M-span store (870k traces) in one go took more than 19 GB (``tracedag score --materialize-part``)."""
COPY_TRACES = CHUNK_TRACES
"""A round of every trace, when the store has at most this many, runs over a copy of their rows (one part of
``_run_round``, as a round of the traces just scored does), not over the views of the store's files: the failure
graph and the six queries then read temporary tables, not the Parquet files through the refined views (the latest
build of each trace, the conversation ids of spans) a dozen times (a store of 200 + 200 spans: x0.9 CPU)."""
ROW_GROUP = 16 * 1024

# The searches below read each trace's latest build (and conversation) alone, not the ``traces`` view's whole rows
# (870k traces, CPU: the waiting traces 1.63 -> 0.54 s, the conversations of 2,000 traces 2.64 -> 0.60 s): the same
# rows where the refined views read the whole store, as they do here (``LiveStore`` makes them so first; a round's
# copies are made after).
_TRACES_SQL = f"""
with t as materialized ({LATEST_CONVERSATIONS_SQL})
select t.trace_id, t.build_id, coalesce(t.conversation_id, t.trace_id) as conversation_key,
       cast(? as bigint) as mat_round, cast(? as varchar) as signature
from t
where coalesce(t.conversation_id, t.trace_id) in (
    select coalesce(conversation_id, trace_id) from t where trace_id in (select trace_id from {SCOPE}))
"""

_PENDING_SQL = f"""
select t.trace_id from ({LATEST_BUILDS_SQL}) t
where not exists (select 1 from {mat.STATE} m where m.trace_id = t.trace_id and m.build_id = t.build_id)
"""


@dataclass
class MaterializeStats:
    """What one materialization round wrote."""

    traces: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    full: bool = False  # every trace at once (the SQL or human labels changed, or the first round of tracedag score)


def materialize(data: Path, scored_files: list[Path], chunk: int = CHUNK_TRACES, limit: int | None = None,
                part: int = PART_TRACES, memory: int | None = None,
                con: duckdb.DuckDBPyConnection | None = None) -> MaterializeStats:
    """Materialize the named queries for the traces of ``scored_files`` and every trace not materialized yet
    (at most ``chunk`` traces, whole conversations, over one copy of their rows). ``limit``: stop after the
    part that reaches this many traces (parts of at most ``min(chunk, limit)``); the rest stays pending; the
    store's first round is then cut like any other (every trace is pending until stored). A round of every
    trace (``tracedag score``'s first, or any after the SQL or human labels changed) runs over a copy of their
    rows when there are at most ``COPY_TRACES``, else over the store as it is, or in parts of ``part`` traces when
    the store has more (``_whole``). ``memory``: DuckDB's memory limit
    in bytes (None: ``score.memory.memory_limit``, a share of the available memory); it spills to the store's
    disk beyond it.

    ``con``: run on this connection (``views.connect``'s, which the caller made spill to a directory of its own,
    ``memory.spill_to``, and closes after this) instead of one of its own: its views are brought to the store as it
    is (``views.refresh_views``) and its memory limit set. Its refined views are left reading the last part's copy,
    and the failure graph's three macros failing where called (``sharedgraph.unshare(restore=False)``): the caller
    closes it next.
    A connection costs ~50 ms CPU to make, ~100 ms with the shared macros, which are made only when a part runs.
    """
    t0 = time.perf_counter()
    stats = MaterializeStats()
    with _connection(data, memory_limit() if memory is None else memory, con) as con:
        signature = mat.signature(data)
        first = not freshness.has_state_view(con)  # nothing stored yet: every trace pending
        stats.full = not (first and limit is not None) and (first or _signature_changed(con, signature))
        if stats.full:
            stats.traces = _whole(con, data, signature, stats, part, first)
        else:
            scope = _every_trace(con) if first else _scope(con, scored_files)
            if scope.num_rows == 0:
                return stats
            stats.traces = _run_round(con, data, scope, signature, stats,
                                      chunk if limit is None else min(chunk, limit), limit)
    stats.seconds = round(time.perf_counter() - t0, 3)
    logger.info("materialized %d traces in %.2fs (%s)", stats.traces, stats.seconds, stats.rows)
    return stats


@contextmanager
def _connection(data: Path, limit: int | None, given: duckdb.DuckDBPyConnection | None) -> Iterator[
        duckdb.DuckDBPyConnection]:
    """``given`` with its views refreshed and its memory ``limit``, else a connection of its own (``bounded_connection``,
    without the shared macros: ``_run_round`` makes them when there is work)."""
    if given is None:
        with bounded_connection(data, limit, shared_macros=False) as con:
            con.execute("set enable_progress_bar = false")
            yield con
        return
    refresh_views(given, data)
    bound(given, limit)
    given.execute("set enable_progress_bar = false")
    yield given


def _whole(con: duckdb.DuckDBPyConnection, data: Path, signature: str, stats: MaterializeStats, part: int,
           first: bool) -> int:
    """Every trace: over a copy of their rows (one part) when there are at most ``COPY_TRACES``, over the views as
    they are when there are at most ``part``; else in parts of ``part`` traces (whole conversations), each over a
    copy of its rows, so that memory follows the part, not the store. In the
    store's first round each part's state lands with it (readers take the SQL for the traces not stored yet, and
    an interrupted round leaves them pending); after a change of the SQL or labels every trace has state rows of
    the old signature, so the state of every part is written at the end, in one file: readers keep the SQL until
    then, and an interrupted round is redone whole by the next."""
    every = _every_trace(con)
    if 0 < every.num_rows <= min(part, COPY_TRACES):  # one part, over a copy of its rows
        return _run_round(con, data, every, signature, stats, part, defer_state=not first)
    if every.num_rows <= part:
        return _run_round(con, data, None, signature, stats)
    logger.info("storing the named queries' results of %d traces in parts of %d", every.num_rows, part)
    return _run_round(con, data, every, signature, stats, part, defer_state=not first)


def _signature_changed(con: duckdb.DuckDBPyConnection, signature: str) -> bool:
    """Whether no round is stored yet or the newest one saw other SQL or human labels (then: every trace)."""
    if not freshness.has_state_view(con):
        return True
    try:
        row = con.execute(f"select arg_max(signature, mat_round) from {mat.STATE}").fetchall()[0]
    except duckdb.BinderException:  # state files of an older layout only
        return True
    return str(row[0] or "") != signature


def _every_trace(con: duckdb.DuckDBPyConnection) -> pa.Table:
    """Every built trace's id (the store's first round, cut into parts)."""
    return arrow(con, "select distinct trace_id from traces_all")  # each has a latest build: ``traces``' ids


def _scope(con: duckdb.DuckDBPyConnection, scored_files: list[Path]) -> pa.Table:
    """The trace ids scored in ``scored_files`` and those whose latest build is not materialized."""
    ids = [pq.read_table(f, columns=["trace_id"]).column("trace_id") for f in scored_files if f.exists()]
    pending = arrow(con, _PENDING_SQL).column("trace_id")
    chunks = [c for col in [*ids, pending] for c in col.chunks]
    column = pa.chunked_array(chunks, pa.string()) if chunks else pa.chunked_array([], pa.string())
    return pa.table({"trace_id": column}).group_by("trace_id").aggregate([])


def _run_round(con: duckdb.DuckDBPyConnection, data: Path, scope: pa.Table | None, signature: str,
               stats: MaterializeStats, chunk: int = CHUNK_TRACES, limit: int | None = None,
               defer_state: bool = False) -> int:
    """Every trace (``scope`` None) at once over the views as they are; else the scope's conversations, at most
    ``chunk`` traces at a time (whole conversations), each over a copy of its rows (``_snapshot``). ``defer_state``:
    the parts' state rows are written after the last part, in one file (``_whole``). The failure graph is shared
    (``sharedgraph``) over each part; its kept rows are dropped at the end, its originals not made again (~35 ms
    CPU): both callers close ``con`` next."""
    _make_macros(con)
    with shared_failure_graph(con, restore=False) as share:  # the connection is closed next
        if scope is None:
            scope = arrow(con, "select trace_id from traces")
            con.register(SCOPE, scope)
            state = arrow(con, _TRACES_SQL, [time.time_ns(), signature])
            return _write_round(con, data, state, stats, share, copied=False)
        con.register(SCOPE, scope)
        state = arrow(con, _TRACES_SQL, [0, signature])
        done, deferred = 0, []
        for part in _chunks(state, chunk):
            part = _copy_part(con, data, part)
            done += _write_round(con, data, part, stats, share, write_state=not defer_state)
            deferred += [part] if defer_state else []
            if limit is not None and done >= limit and not defer_state:
                break
    if deferred:
        _write_state(data, pa.concat_tables(deferred))
    return done


def _make_macros(con: duckdb.DuckDBPyConnection) -> None:
    """The shared macros the stored queries call: 7 of the 10 (not ``span_costs``, ``model_prices``,
    ``failure_graph``; ~50 ms CPU, all ~60). The failure graph's three are made too, though ``sharedgraph`` replaces
    them: DuckDB binds the macros a macro calls when it is made (``failure_roots``, the originals kept)."""
    create_shared_macros(con, "\n;\n".join(queries.load(name) for name in mat.SPECS))


def _copy_part(con: duckdb.DuckDBPyConnection, data: Path, part: pa.Table) -> pa.Table:
    """``part``'s state rows stamped with a new round, and a copy of its traces' rows (``_snapshot``) that the
    restricted views read."""
    part = part.set_column(part.schema.get_field_index("mat_round"), "mat_round",
                           pa.array([time.time_ns()] * part.num_rows, pa.int64()))
    con.register(SCOPE + "_all", part.select(["trace_id"]))
    _snapshot(con, data)
    return part


def _chunks(state: pa.Table, size: int) -> list[pa.Table]:
    """``state`` cut into parts of at most ``size`` traces (more for a conversation that has more), whole
    conversations in each."""
    state = state.take(pc.sort_indices(state, sort_keys=[("conversation_key", "ascending")]))
    keys = state.column("conversation_key").to_pylist()
    parts, start = [], 0
    for i in range(1, len(keys) + 1):
        if i == len(keys) or (i - start >= size and keys[i] != keys[i - 1]):
            parts.append(state.slice(start, i - start))
            start = i
    return parts


def _snapshot(con: duckdb.DuckDBPyConnection, data: Path, tables: Iterable[str] = tuple(_LATEST)) -> None:
    """Copy the rows of the traces in ``SCOPE_all`` from each of ``tables`` (raw tables the refined views read; every
    one by default) into a temporary table, reading only the files that hold them (``mixed.narrowed``), and make the
    refined view read that copy: the named queries then read each table once a part (a dozen scans each otherwise),
    and the refined views (the latest build, the conversation ids of spans) give the scope's traces exactly the rows
    they give them over the whole store."""
    sources = narrowed(con, data, f"{SCOPE}_all", tables)
    forget_views(con, replacing=sources)  # the others its own too, over these; a refresh makes them read the store
    for table, source in sources.items():
        body, raw, copy = _LATEST[table], f"{table}_all", f"{SNAPSHOT}{table}"
        con.execute(f"create or replace temp table {copy} as {_copied_columns(con, table, source)} from {source}")
        refined = re.sub(rf"\bfrom {raw}\b", f"from {copy}", body)
        assert refined != body, table
        own_view(con, table, refined)


UNREAD = {"spans": ("attributes", "events", "links", "resource_attributes")}
"""The largest columns of the raw tables that no stored query reads today: a part's copy leaves out those that
neither the stored queries' SQL nor the shared macros it calls names (``_unread``), so that they are not decoded
(``attributes`` is 11 of the 20 MB of a live round's spans file, uncompressed; the spans copy of a part of 1,400
traces took ~0.4 s CPU). A query that comes to read one of them gets it copied again."""


def _unread(table: str) -> tuple[str, ...]:
    """The columns of ``UNREAD[table]`` whose names no stored query or shared macro it calls mentions (even in a
    comment), remembered while the SQL is the same (``materialized.definitions_hash``, ~3 ms; this ~90 ms)."""
    return _unread_by(UNREAD.get(table, ()), mat.definitions_hash())


@functools.lru_cache(maxsize=16)
def _unread_by(columns: tuple[str, ...], definitions: str) -> tuple[str, ...]:
    del definitions  # the key: the SQL read below
    text = "\n".join(queries.load(name) for name in mat.SPECS)
    text = "\n".join([text, *(statement for _, statement in needed_shared_macros(text))])
    return tuple(c for c in columns if not re.search(rf"\b{c}\b", text))


def _copied_columns(con: duckdb.DuckDBPyConnection, table: str, source: str) -> str:
    """The select list of ``_snapshot``'s copy of ``table`` from ``source``: every column but those ``_unread``."""
    unread = _unread(table)
    if unread:
        columns = {d[0] for d in con.execute(f"select * from {source} limit 0").description}
        unread = tuple(c for c in unread if c in columns)
    return f"select * exclude ({', '.join(unread)})" if unread else "select *"


def _write_round(con: duckdb.DuckDBPyConnection, data: Path, state: pa.Table, stats: MaterializeStats,
                 share: Callable[[], bool], write_state: bool = True, copied: bool = True) -> int:
    """Write every named query's rows over ``con``'s views (``copied``: a copy of ``state``'s traces' rows,
    ``_snapshot``), then ``state`` (the round is visible from then on; ``write_state`` False: the caller writes it
    later). ``share`` computes the failure graph over the views first (once for every query, not once per query)."""
    round_ns = int(state.column("mat_round")[0].as_py()) if state.num_rows else time.time_ns()
    con.register("__tracedag_mat_builds", state.select(["trace_id", "build_id"]))
    share()
    for name, per, rows in stored_rows(con, round_ns, alone=copied and one_turn_each(state)):
        n = write_rows(data, name, rows)
        stats.rows[_label(name, per)] = stats.rows.get(_label(name, per), 0) + n
    if write_state:
        _write_state(data, state)
    return int(state.num_rows)


def _write_state(data: Path, state: pa.Table) -> None:
    """The state rows of a round (or of every part of one), by trace id, in one file; the kept table of each
    trace's newest round (``store.current_rounds``) advances with them, so no reader recomputes it."""
    state = state.take(pc.sort_indices(state, sort_keys=[("trace_id", "ascending")]))
    before = current_rounds.listing(data)
    write_parquet_atomic(state, table_dir(data, mat.STATE), row_group_size=ROW_GROUP)
    current_rounds.advance(data, before, state)


def _label(name: str, per: str | None) -> str:
    return name if per is None else f"{name} per={per}"


ALONE = ("root_causes",)
"""The stored queries whose ``per=conversation`` rows are their ``per=trace`` rows (``per`` aside) over a copy of
whole conversations' rows (``_snapshot``) when each of these conversations has one trace: across the turns of a
one-turn conversation, the failure graph is the graph within its trace under other keys (``grp``, ``node``,
``turn_index``, which order alike within one trace and which ``root_causes`` does not show), and the data edges it
reads from another trace (per conversation only) name a trace the copy does not hold. ``stored_rows`` then takes
them from the ``per=trace`` rows: the round plans and runs the failure graph's originals across turns only for
conversations of several turns (~0.1 s CPU a part on a small store, the round's costliest statement)."""


def one_turn_each(state: pa.Table) -> bool:
    """Whether each conversation of ``state`` (``_TRACES_SQL``'s rows, ``conversation_key``) has one trace."""
    keys = state.column("conversation_key")
    return bool(keys.null_count == 0 and len(pc.unique(keys)) == state.num_rows)


def stored_rows(con: duckdb.DuckDBPyConnection, round_ns: int, alone: bool = False) -> Iterator[
        tuple[str, str | None, pa.Table]]:
    """(name, per, rows) of each stored query with its defaults over ``con``'s views (``result_rows``); ``alone``:
    the views read a copy of whole conversations of one trace each (``one_turn_each``), the ``per=conversation`` rows
    of the ``ALONE`` queries are then their ``per=trace`` rows."""
    for name, spec in mat.SPECS.items():
        by_trace: pa.Table | None = None
        for per in spec.pers or (None,):
            if alone and per == "conversation" and by_trace is not None and name in ALONE:
                field = by_trace.schema.field("per")
                rows = by_trace.set_column(by_trace.schema.get_field_index("per"), field,
                                           pa.array([per] * by_trace.num_rows, field.type))
            else:
                rows = result_rows(con, name, per, round_ns)
            by_trace = rows if per == "trace" else by_trace
            yield name, per, rows


def result_rows(con: duckdb.DuckDBPyConnection, name: str, per: str | None, round_ns: int) -> pa.Table:
    """``name``'s rows with its defaults (and ``per``) over ``con``'s views, with the build of each trace (the
    registered ``__tracedag_mat_builds``) and the round, as stored. On a connection sharing the failure graph, only
    per=conversation binds its original definitions (``sharedgraph.across_turns``)."""
    across_turns(con, per == "conversation")
    given = {} if per is None else {"per": per}
    values = bind_params(queries.describe(name), given)
    extra = f", cast('{per}' as varchar) as per" if per is not None else ""
    sql = (f"select r.*, b.build_id, cast({round_ns} as bigint) as mat_round{extra} "
           f"from ({queries.load(name).strip().rstrip(';')}) r join __tracedag_mat_builds b using (trace_id)")
    return arrow(con, sql, values)


def write_rows(data: Path, name: str, rows: pa.Table) -> int:
    """Write ``name``'s stored ``rows`` (``result_rows``) as one file of its table; return how many."""
    directory = table_dir(data, mat.table_name(name))
    schema_file = directory / f"{mat.SCHEMA_STEM}.parquet"
    if not schema_file.exists() or not pq.read_schema(schema_file).equals(rows.schema, check_metadata=False):
        write_parquet_atomic(rows.schema.empty_table(), directory, stem=mat.SCHEMA_STEM)  # the query's columns now
    if rows.num_rows:  # by trace id, small row groups: one trace's rows are found by their statistics
        rows = rows.take(pc.sort_indices(rows, sort_keys=[("trace_id", "ascending")]))
        write_parquet_atomic(rows, directory, row_group_size=ROW_GROUP)
    return int(rows.num_rows)


def materialized_tables() -> list[str]:
    """Every table directory materialization writes (results, then the state)."""
    return [*(mat.table_name(n) for n in mat.SPECS), mat.STATE]

