"""Named queries on a store whose newest builds are not all materialized yet: stored rows, and SQL for the rest.

A live round of ``tracedag collect --build`` may leave the materialization of its traces to a later
round. Until then ``freshness.freshness`` names the traces the stored rows do not answer: every
trace of a conversation one of whose traces has a latest build without stored rows (a later turn
changes the earlier turns' rows). ``read`` answers a materialized named query with the stored rows of
every other trace and the query's SQL over views whose ``traces`` hold only those traces (the scope a
materialize round computes them in, so they are the rows it would store), in the query's order. The
SQL stays the reference: tests/queries/test_materialized.py checks that both give the same rows. The rows computed
are kept under what they depend on (``mixedkept``): a later ``run_named`` of the same files (a live poll between two
rounds) reads them with the stored rows (``read_kept``) instead of computing them again.
"""

from __future__ import annotations

import bisect
import logging
import re
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from tracedag.pipeline.store import current_rounds, freshness, materialized, mixedkept
from tracedag.pipeline.store.fetch import arrow
from tracedag.pipeline.store.fileids import rows_in
from tracedag.pipeline.store.files import parquet_files
from tracedag.pipeline.store.remote import remote_of
from tracedag.pipeline.store.selection import literal
from tracedag.pipeline.store.shared_macros import create_shared_macros
from tracedag.pipeline.store.views import _LATEST, connect, forget_views, own_view, refresh_views
from tracedag.schemas.layout import table_dir

logger = logging.getLogger(__name__)

SCOPE = "__tracedag_mixed_scope"


def read(con: duckdb.DuckDBPyConnection, data: Path, name: str, sql: str,
         values: dict[str, object], keep: bool = True) -> pa.Table | None:
    """``name``'s result from its stored rows and its SQL (``sql``, ``values``) over the traces they do not
    answer; None when the stored rows answer every trace or too few (then one statement does it all).

    Restricts ``con``'s refined views: for a connection of its own (``querying.run_named``), or one whose later
    queries are read here too or after ``unrestrict`` (``querying.run_named_together``). A connection restricted
    to the same traces by a query before keeps its views (its copies of their rows): the stored rows of one trace
    or of every trace are read from the raw and stored tables alone, never from the refined views. ``keep``: keep the
    rows computed for a later poll (``mixedkept``; False: none is, as ``read_parts`` decided)."""
    pending = _pending(con, data, name, values)
    if pending is None:
        return None
    state, one, whole, threshold = pending
    found = mixedkept.sources(data, name, values, state.stale, threshold) if keep else None
    files = None if found is None else found.files
    held = _SCOPED.get(con)
    if held is None or not held.serves(state.stale, threshold, files) or not (one or whole):  # a time window's read calls trace_window
        unrestrict(con, data)
    con.register(SCOPE, _ids(state.stale))
    stored = _stored(con, data, name, values)
    if con not in _SCOPED:
        _SCOPED[con] = _Held(state.stale, threshold, _restrict(con, data, state.stale, threshold, files), files)
    computed = arrow(con, sql, values or None)  # planned once
    mixedkept.keep(found, computed)
    logger.info("query %s: %d stored rows, %d computed for %d traces not materialized yet (%d read)",
                name, stored.num_rows, computed.num_rows, len(state.stale), len(_SCOPED[con].traces))
    return ordered(name, stored, computed)


def _pending(con: duckdb.DuckDBPyConnection, data: Path, name: str,
             values: dict[str, object]) -> tuple[freshness.Freshness, bool, bool, float | None] | None:
    """For ``read`` and ``read_parts``: the store's freshness, ``scope_flags`` and the failure threshold when ``name``
    with ``values`` is answered from stored rows plus the SQL over traces not stored yet; None: it is not."""
    if not materialized.matches(name, values):
        return None
    state = freshness.freshness(con, data)
    if not state.usable or not state.stale:
        return None
    one, whole = materialized.scope_flags(values)
    return state, one, whole, _failure_threshold(name, values)


def read_kept(data: Path, name: str, values: dict[str, object], threads: int | None = None) -> pa.Table | None:
    """``read``'s answer when the rows of the traces not stored yet were computed for the same files before
    (``mixedkept``), or those of each of their conversations were, read with only the stored rows' views (a poll
    between two live rounds, or after a build or a stored round: no refined view, no shared macro, no SQL); None:
    ``read_parts`` (or the SQL) answers, on a connection with every view."""
    one, whole = materialized.scope_flags(values)
    if not materialized.matches(name, values) or not (one or whole):  # a time window's read calls trace_window
        return None
    state = freshness.known_freshness(data)
    if state is None or not state.usable or not state.stale:
        return None
    threshold = _failure_threshold(name, values)
    found = mixedkept.sources(data, name, values, state.stale, threshold, mark=False)
    if found is None:
        return None
    computed = mixedkept.kept(found)
    con = connect(data, threads=threads, tables=materialized.reader_tables(name))
    try:
        con.register(SCOPE, _ids(state.stale))
        if computed is None:  # a new state: every conversation's rows kept (a live build, a stored round)?
            computed = _kept_conversations(con, found, threshold)
            if computed is None:
                return None
            mixedkept.keep(found, computed)
        stored = _stored(con, data, name, values)
    finally:
        con.close()
    logger.info("query %s: %d stored rows, %d computed before for the %d traces not materialized yet",
                name, stored.num_rows, computed.num_rows, len(state.stale))
    return ordered(name, stored, computed)


def read_parts(con: duckdb.DuckDBPyConnection, data: Path, name: str, sql: str,
               values: dict[str, object]) -> pa.Table | None:
    """``read``'s answer for ``run_named`` (a connection of its own, closed after): the rows of the traces not stored
    yet computed only for the conversations whose rows are not kept for the files they come from (``mixedkept.parts``:
    a live round adds a few, a stored round or a build of traces not scored yet none), the others' rows read from
    what this process kept; ``read`` itself for a time window or an object store. Makes the shared macros ``sql``
    calls when it runs it (the caller makes them before the SQL when this gives None)."""
    pending = _pending(con, data, name, values)
    if pending is None:
        return None
    state, one, whole, threshold = pending
    found = mixedkept.sources(data, name, values, state.stale, threshold) if one or whole else None
    if found is None:
        create_shared_macros(con, sql)
        return read(con, data, name, sql, values, keep=False)
    con.register(SCOPE, _ids(state.stale))
    computed = mixedkept.kept(found)
    if computed is None:
        computed = _by_conversation(con, data, sql, values, found, threshold)
        mixedkept.keep(found, computed)
    stored = _stored(con, data, name, values)
    logger.info("query %s: %d stored rows, %d computed for the %d traces not materialized yet",
                name, stored.num_rows, computed.num_rows, len(state.stale))
    return ordered(name, stored, computed)


def _by_conversation(con: duckdb.DuckDBPyConnection, data: Path, sql: str, values: dict[str, object],
                     found: mixedkept.Sources, threshold: float | None) -> pa.Table:
    """The SQL's rows of the conversations of ``SCOPE`` it computes (with a ``threshold``: those with a failing score,
    ``FAILURE_ROWS``), each from the rows kept for it or computed now with the others not kept, in one statement."""
    groups = _groups(con, found, threshold)
    keys = mixedkept.parts(found, groups)
    rows = {c: mixedkept.kept_part(k) for c, k in keys.items()}
    todo = sorted(c for c, r in rows.items() if r is None)
    columns = mixedkept.schema(found)
    if todo or columns is None:
        scope = tuple(sorted(t for c in todo for t in groups[c]))
        create_shared_macros(con, sql)
        unrestrict(con, data)
        _SCOPED[con] = _Held(scope, None, _restrict(con, data, scope, None, found.files), found.files)
        new = arrow(con, sql, values or None)  # planned once
        owner = {t: c for c in todo for t in groups[c]}
        ids = new.column("trace_id").to_pylist()
        if any(t not in owner for t in ids):
            raise ValueError(f"rows of traces outside the conversations computed: {sorted(set(ids) - set(owner))[:5]}")
        at: dict[str, list[int]] = {c: [] for c in todo}
        for i, t in enumerate(ids):
            at[owner[t]].append(i)
        grouped = new.take(pa.array([i for c in todo for i in at[c]], pa.int64()))  # one take, then a slice each
        start = 0
        for c in todo:
            rows[c] = grouped.slice(start, len(at[c]))
            start += len(at[c])
            mixedkept.keep_part(keys[c], rows[c])
        columns = new.schema
        mixedkept.keep_schema(found, columns)
    parts = [r for c in sorted(rows) if (r := rows[c]) is not None]
    return pa.concat_tables(parts).combine_chunks() if parts else columns.empty_table()  # one chunk: sorted after


def _kept_conversations(con: duckdb.DuckDBPyConnection, found: mixedkept.Sources,
                        threshold: float | None) -> pa.Table | None:
    """The rows of the conversations of ``SCOPE`` computed (``_by_conversation``) when every one's are kept, else None."""
    columns = mixedkept.schema(found)
    if columns is None:
        return None
    rows = [mixedkept.kept_part(k) for k in mixedkept.parts(found, _groups(con, found, threshold)).values()]
    if any(r is None for r in rows):
        return None
    parts = [r for r in rows if r is not None]
    return pa.concat_tables(parts).combine_chunks() if parts else columns.empty_table()


def _groups(con: duckdb.DuckDBPyConnection, found: mixedkept.Sources, threshold: float | None) -> dict[
        str, tuple[str, ...]]:
    """The conversations of the traces of ``SCOPE`` (with a ``threshold``: those with a failing score) and their
    traces, from the files ``found`` names (on any connection: no view read)."""
    traces, scores = found.files["traces"], found.files["step_scores"]
    if not traces or (threshold is not None and not scores):
        return {}
    ids = f"(select trace_id from {SCOPE})"
    failing = "" if threshold is None else _FAILING_WHERE.format(scores=rows_in("step_scores", scores, ids))
    found_groups = con.execute(_GROUPS_SQL.format(traces=rows_in("traces", traces, ids), failing=failing),
                               {"threshold": threshold} if threshold is not None else None).fetchall()
    return {str(c): tuple(str(t) for t in ts) for c, ts in found_groups}


# The conversations (by each trace's latest build, as ``freshness.freshness`` groups them) of the traces in
# ``{traces}`` (the rows of those of ``SCOPE``) and their traces; ``{failing}``: only those with a failing score row.
_GROUPS_SQL = """
with latest as (
    select trace_id, arg_max(coalesce(conversation_id, trace_id), (built_unix_nano, build_id)) as conversation_key
    from {traces} group by trace_id
)
select conversation_key, list(trace_id order by trace_id) from latest {failing}
group by conversation_key
"""
_FAILING_WHERE = """
where conversation_key in (
    select conversation_key from latest
    where trace_id in (select trace_id from {scores} where score is not null and score <= $threshold))
"""


def _ids(traces: tuple[str, ...]) -> pa.Table:
    return pa.table({"trace_id": pa.array(traces, pa.string())})


FAILURE_ROWS = frozenset({"failures", "propagation", "root_causes"})
"""The stored queries whose every row is about a failed step (``failure_steps``: a step whose score, from its
``step_scores`` rows with a score <= ``$fail_threshold`` or from a human, is <= ``$fail_threshold``), per trace, step
or conversation: a conversation none of whose traces has a ``step_scores`` row with a score <= ``$fail_threshold``
(of any build) has no row. ``read`` computes them over the conversations that have one only: a live poll's
traces not stored yet are mostly traces that passed or are not scored yet (a round between its build and its
score), and their rows are none."""


@dataclass(frozen=True)
class _Held:
    """What ``read`` restricted a connection's refined views to: the traces not stored yet (``stale``), and
    ``traces``, those of them the views hold: every one, or (``threshold`` not None) only the conversations
    with a failing score row (``FAILURE_ROWS``)."""

    stale: tuple[str, ...]
    threshold: float | None
    traces: tuple[str, ...]
    files: dict[str, tuple[str, ...]] | None = None

    def serves(self, stale: tuple[str, ...], threshold: float | None, files: dict[str, tuple[str, ...]] | None) -> bool:
        """Whether a query over ``stale`` (``threshold``: one of ``FAILURE_ROWS``) whose traces are in ``files``
        (``mixedkept.Sources.files``: the rows it computes are kept under them) reads these views as they are."""
        return self.stale == stale and self.threshold in (None, threshold) and self.files == files


def _failure_threshold(name: str, values: dict[str, object]) -> float | None:
    """``$fail_threshold`` of a query of ``FAILURE_ROWS`` (None: another query, or no number)."""
    threshold = values.get("fail_threshold")
    if name not in FAILURE_ROWS or isinstance(threshold, bool) or not isinstance(threshold, int | float):
        return None
    return float(threshold)


_SCOPED: weakref.WeakKeyDictionary[duckdb.DuckDBPyConnection, _Held] = weakref.WeakKeyDictionary()
"""The traces each connection's refined views were restricted to by ``read`` (until ``unrestrict``)."""


def unrestrict(con: duckdb.DuckDBPyConnection, data: Path) -> None:
    """Bring ``con``'s refined views back to every trace of ``data`` when ``read`` restricted them (else nothing)."""
    if _SCOPED.pop(con, None) is not None:
        refresh_views(con, data)


def covers(con: duckdb.DuckDBPyConnection, trace_id: str) -> bool:
    """Whether ``con``'s refined views hold ``trace_id``'s whole conversation (``read`` or ``restrict_to_conversation``
    restricted them to it): a named query narrowed to that trace gives the rows it gives over every trace."""
    held = _SCOPED.get(con)
    scope = () if held is None else held.traces
    i = bisect.bisect_left(scope, trace_id)
    return i < len(scope) and scope[i] == trace_id


# The traces of one trace's conversation (the trace alone without one), by the latest build of each, as
# ``freshness.freshness`` groups them: the scope a materialize round computes the trace's rows in.
_CONVERSATION_SQL = """
with latest as (
    select trace_id, arg_max(coalesce(conversation_id, trace_id), (built_unix_nano, build_id)) as conversation_key
    from traces_all group by trace_id
)
select trace_id from latest where conversation_key = (select conversation_key from latest where trace_id = $t)
order by trace_id
"""


def restrict_to_conversation(con: duckdb.DuckDBPyConnection, data: Path, trace_id: str) -> None:
    """Make ``con``'s refined views hold only the traces of ``trace_id``'s conversation (as ``read`` restricts them
    to the traces not stored yet): the named queries narrowed to ``trace_id`` then read those traces' files and
    rows only (``covers``), and give its rows over every trace. For a reader of one trace (serve's view)."""
    found = con.sql(_CONVERSATION_SQL, params={"t": trace_id}).fetchall()
    scope = tuple(str(t) for (t,) in found)
    unrestrict(con, data)
    _SCOPED[con] = _Held(scope, None, _restrict(con, data, scope, None))


COPY_TRACES = 5_000
"""Up to this many traces computed from the SQL (a live round's backlog), the rows of those traces in the tables
sorted by trace id are copied first: a named query's SQL scans ``traces`` a dozen times and ``step_scores``,
``dag_nodes``, ``dag_edges`` several times (root_causes over 10 traces on 1M spans: 1.25 -> 0.74 s CPU, 300 traces
2.4 -> 1.6 s). The copies hold the refined views' rows (each trace's latest build, made once), not the raw ones
the views would join again at every scan (a poll of 3,578 traces on 200k spans: x0.9 CPU). ``spans`` is read in
place, from the files that hold those traces (``narrowed``). More traces: filtered in place (memory)."""
_COPIED = ("traces", "dag_nodes", "dag_edges", "step_scores")


def narrowed(con: duckdb.DuckDBPyConnection, data: Path, relation: str,
             tables: Iterable[str] = tuple(_LATEST), files: dict[str, tuple[str, ...]] | None = None) -> dict[str, str]:
    """For each of ``tables`` (raw tables the refined views read, ``views._LATEST``: ``spans``, ``traces``, ...), SQL
    of its rows of the traces whose ids ``relation`` lists, reading only the files that hold one of them.

    The files are found by a scan of their ``trace_id`` column alone, or in a process that read the store before, by
    the trace ids it keeps of each file (``mixedkept.files_holding``: only new files are read). Filtering the whole table instead read every
    column of every file (a scan drops rows only after decoding them), whatever the traces asked: a live round's
    10k spans copied out of 240k took ~0.9 s CPU, ~0.25 s from the four files that held them. A trace's rows of
    every build are in the files found, so the refined views give it the rows they give it over the whole store.
    An object store's tables (files listed, fetched through the cache) are filtered in place. ``files``: each
    table's files known to hold every one of those traces (``mixedkept.Sources.files``), read instead of found."""
    ids = f"(select trace_id from {relation})"
    if remote_of(data) is not None:
        return {t: f"(select * from {t}_all where trace_id in {ids})" for t in tables}
    if files is not None:
        return {t: rows_in(t, files[t], ids) for t in tables}
    if mixedkept.indexed(data):  # a process that reads the store again (a collector's passes, a server)
        traces = [str(t) for t in con.sql(f"select distinct trace_id from {relation}").fetchnumpy()["trace_id"]]
        return {t: rows_in(t, mixedkept.files_holding(data, t, traces), ids) for t in tables}
    return {t: _files_holding(con, data, t, ids) for t in tables}


def _files_holding(con: duckdb.DuckDBPyConnection, data: Path, table: str, ids: str) -> str:
    """SQL of ``table``'s rows of the traces ``ids``, over the files that hold one (none: no rows)."""
    if not parquet_files(data, table):  # a store not scored yet has no step_scores (a glob of none fails)
        return f"(select * from {table}_all where false)"
    pattern = literal(str(table_dir(data, table) / "**" / "*.parquet"))
    found = con.execute(f"select distinct filename from read_parquet({pattern}, filename = true, "
                        f"union_by_name = false, hive_partitioning = false) where trace_id in {ids}").fetchall()
    return rows_in(table, [str(f) for (f,) in found], ids)


def _restrict(con: duckdb.DuckDBPyConnection, data: Path, scope: tuple[str, ...], threshold: float | None,
              files: dict[str, tuple[str, ...]] | None = None) -> tuple[str, ...]:
    """Make ``con``'s refined views hold only the traces of ``scope`` (sorted; as ``views.restrict_traces``), or with
    a ``threshold`` only its conversations with a failing score row (``FAILURE_ROWS``), from the files that hold
    them (``narrowed``), those of the tables sorted by trace id a copy of their rows when they are few
    (``COPY_TRACES``); ``files`` as ``narrowed``'s. Returns the traces held, sorted."""
    forget_views(con, replacing=_LATEST)  # the next refresh_views makes them all again
    con.register(HELD, pa.table({"trace_id": pa.array(scope, pa.string())}))
    sources = narrowed(con, data, HELD, files=files)  # the files of ``scope``: those of any part of it too
    if threshold is not None:
        found = arrow(con, _FAILING_SQL.format(traces=sources["traces"], scores=sources["step_scores"]),
                      {"threshold": threshold}).column("trace_id")
        scope = tuple(str(t) for t in found.to_pylist())
        con.register(HELD, pa.table({"trace_id": pa.array(scope, pa.string())}))
    for table, body in _LATEST.items():  # ``traces`` before the views that join it
        refined = re.sub(rf"\bfrom {table}_all\b", f"from {sources[table]}", body, count=1)
        assert refined != body, table
        if table in _COPIED and len(scope) <= COPY_TRACES:
            copy = f"{SCOPE}_{table}"
            con.execute(f"create or replace temp table {copy} as {refined}")
            refined = f"select * from {copy}"
        own_view(con, table, refined)
    return scope


HELD = f"{SCOPE}_held"
"""The traces ``_restrict`` makes the refined views hold (``SCOPE``: those not stored yet, whose stored rows are
left out)."""

# The traces of the conversations (by each trace's latest build, as ``freshness.freshness`` groups them) with a
# step_scores row of any build whose score is <= $threshold, from the rows of the traces ``HELD`` lists.
_FAILING_SQL = """
with latest as (
    select trace_id, arg_max(coalesce(conversation_id, trace_id), (built_unix_nano, build_id)) as conversation_key
    from {traces} group by trace_id
)
select trace_id from latest
where conversation_key in (
    select conversation_key from latest
    where trace_id in (select trace_id from {scores} where score is not null and score <= $threshold))
order by trace_id
"""


def _stored(con: duckdb.DuckDBPyConnection, data: Path, name: str, values: dict[str, object]) -> pa.Table:
    """The stored rows of the traces not in ``SCOPE``; of a whole store through the kept current rounds
    (``current_rounds``), unless a round or a collection changed them meanwhile (then the SQL's own join)."""
    params = materialized.reader_values(name, values)
    one, whole = materialized.scope_flags(values)
    current = current_rounds.register(con, data) if whole and not one else None
    if current is not None:
        reader = materialized.reader_sql(name, one, whole, skip=SCOPE, current=current_rounds.RELATION)
        table = arrow(con, reader, params or None)
        if current_rounds.listing(data) == current.listing:
            return table
    return arrow(con, materialized.reader_sql(name, one, whole, skip=SCOPE), params or None)


def ordered(name: str, stored: pa.Table, computed: pa.Table) -> pa.Table:
    """The two parts as one table in the query's order (``materialized.SPECS``; nulls last, as DuckDB)."""
    if stored.schema.names != computed.schema.names:
        raise ValueError(f"{name}: stored columns {stored.schema.names} differ from the SQL's {computed.schema.names}")
    both = pa.concat_tables([stored.cast(computed.schema), computed])
    keys = [(c.strip(), "ascending") for c in materialized.SPECS[name].order.split(",")]
    return both.take(pc.sort_indices(both, sort_keys=keys)) if both.num_rows else both
