"""Run named queries (``queries/*.sql``) and ad-hoc SQL over the views, and write the results.

Parameters are always bound (``$name``), never formatted into the SQL text. Values given on the
command line are converted to the type the query header declares; a parameter the header does not
declare but the body uses defaults to NULL.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TypeVar

import duckdb
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from tracedag import queries
from tracedag.pipeline.store import current_rounds, freshness, materialized, mixed, procdb
from tracedag.pipeline.store.cachereads import urls_only
from tracedag.pipeline.store.fetch import arrow
from tracedag.pipeline.store.files import parquet_files, rerun_if_vanished, write_all
from tracedag.pipeline.store.query_macros import create_query_macros, mentioned_queries
from tracedag.pipeline.store.sandbox import check_select, deadline, lock_down
from tracedag.pipeline.store.shared_macros import create_shared_macros
from tracedag.pipeline.store.views import connect, create_views
from tracedag.schemas.errors import QueryFailed
from tracedag.schemas.layout import state_dir

logger = logging.getLogger(__name__)
_T = TypeVar("_T")

FORMATS = ("table", "csv", "json", "parquet")
SINCE_PARAM = "since_ns"
_UNITS_NS = {"s": 10**9, "m": 60 * 10**9, "h": 3600 * 10**9, "d": 86400 * 10**9, "w": 7 * 86400 * 10**9}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def since_to_ns(text: str, now_ns: int | None = None) -> int:
    """Turn ``--since`` text (``90s``, ``15m``, ``1h``, ``2d``, ``1w``, or an ISO time) into ns since epoch."""
    m = _DURATION.match(text)
    if m:
        now = time.time_ns() if now_ns is None else now_ns
        return now - int(float(m[1]) * _UNITS_NS[m[2]])
    try:
        when = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError as e:
        raise QueryFailed("--since", f"{text!r} is neither a duration like 1h/30m/2d nor an ISO time") from e
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp()) * 10**9 + when.microsecond * 1000


def _convert(query: str, param: queries.Param, text: str) -> object:
    """Convert a parameter value given as text to the declared type."""
    if param.choices and text not in param.choices:
        raise QueryFailed(query, f"param {param.name}: {text!r} is not one of {', '.join(param.choices)}")
    try:
        if param.type == "double":
            return float(text)
        if param.type in ("bigint", "integer"):
            return int(text)
    except ValueError as e:
        raise QueryFailed(query, f"param {param.name}: {text!r} is not a {param.type}") from e
    if param.type == "boolean":
        if text.lower() not in _TRUE | _FALSE:
            raise QueryFailed(query, f"param {param.name}: {text!r} is not a boolean")
        return text.lower() in _TRUE
    return text


def bind_params(doc: queries.QueryDoc, given: Mapping[str, str]) -> dict[str, object]:
    """Return the values of every parameter the query body uses: given ones converted, else defaults."""
    declared = {p.name: p for p in doc.params}
    unknown = sorted(set(given) - set(declared) - set(doc.used))
    if unknown:
        known = ", ".join(sorted(set(declared) | set(doc.used))) or "none"
        raise QueryFailed(doc.name, f"unknown param {', '.join(unknown)} (params: {known})")
    values: dict[str, object] = {}
    for name in doc.used:
        param = declared.get(name)
        if param is None:
            values[name] = given.get(name)
        else:
            values[name] = _convert(doc.name, param, given.get(name, param.default))
    return values


def parse_param_args(pairs: tuple[str, ...] | list[str]) -> dict[str, str]:
    """Turn ``k=v`` strings into a dict (the value may contain ``=``)."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise QueryFailed("--param", f"{pair!r} is not of the form name=value")
        out[key.strip()] = value
    return out


def query_doc(name: str) -> queries.QueryDoc:
    """Return the parsed header of a named query, or raise ``QueryFailed`` for an unknown name."""
    if name not in queries.names():
        raise QueryFailed(name, f"no such query (known: {', '.join(queries.names())})")
    return queries.describe(name)


def run_named(
    data: Path, name: str, params: Mapping[str, str] | None = None, since: str | None = None,
    threads: int | None = None, timeout: float | None = None,
) -> pa.Table:
    """Run the named query over the store at ``data`` and return its result."""
    doc = query_doc(name)
    given = dict(params or {})
    if since is not None:
        if SINCE_PARAM not in doc.used:
            raise QueryFailed(name, "this query has no time filter, --since does not apply")
        given[SINCE_PARAM] = str(since_to_ns(since))
    values = bind_params(doc, given)
    logger.info("query %s with %s", name, values)
    return _execute(data, name, queries.load(name), values, Limits(threads, timeout, named=name))


_NEEDS = re.compile(r"\b(spans|traces|dag_nodes|dag_edges|step_scores)\b")


def empty_hint(data: Path, name: str | None, sql: str | None = None) -> str | None:
    """Why a query over ``data`` may have come back empty, and what to run, when the store lacks its input."""
    text = queries.load(name) if name else (sql or "")
    needs = set(_NEEDS.findall(text))
    if not parquet_files(data, "spans"):
        return (f"the store has no spans yet: send them to `tracedag collect --data {data}` or load a dump with "
                f"`tracedag ingest FILE --data {data}`")
    if needs & {"traces", "dag_nodes", "dag_edges"} and not parquet_files(data, "traces"):
        return (f"nothing is built yet: run `tracedag build --data {data}` (or collect with "
                "`tracedag collect --build`, which builds and scores as spans arrive)")
    if "step_scores" in needs and not parquet_files(data, "step_scores"):
        return f"no step is scored yet: run `tracedag score --data {data}`"
    return None


@dataclass(frozen=True)
class Limits:
    """How a query runs: DuckDB threads, a deadline in seconds, the read-only sandbox, the query macros."""

    threads: int | None = None
    timeout: float | None = None
    read_only: bool = False
    macros: bool = False  # make the named queries the SQL calls table macros first
    named: str | None = None  # the named query run: read its materialized rows when they answer it


def run_sql(data: Path, sql: str, threads: int | None = None, timeout: float | None = None,
            read_only: bool = False) -> pa.Table:
    """Run ad-hoc SQL over the views of the store at ``data``.

    ``read_only``: exactly one SELECT, with file access to the store only (``store.sandbox``).
    ``timeout``: seconds before the query is interrupted (``QueryFailed``).
    """
    if read_only:
        check_select(sql)
    return _execute(data, "--sql", sql, {}, Limits(threads, timeout, read_only, macros=True))


def run_named_together(data: Path, asked: list[tuple[str, Mapping[str, str]]], threads: int | None = None,
                       timeout: float | None = None, trace_id: str | None = None) -> list[pa.Table]:
    """The results of several named queries (name, params), as ``run_named`` gives each, on one connection.

    For a reader of one trace that stored rows do not answer (serve's trace view): ``run_named`` for each
    query made a connection and bound the shared macros for each (~0.17 s CPU each, 2-3 s a view of a trace
    on a store of 1,500 spans). Here they are made once: the views, then the shared macros when a query calls
    them. A query ``store.mixed`` answers restricts the refined views to the traces not stored yet, once for
    all of them; a query answered from its SQL alone brings them back to the whole store first
    (``mixed.unrestrict``). Everything is run again on a new connection when a file vanished under a swap.

    ``trace_id``: the queries are narrowed to this trace; the refined views then hold its conversation's traces
    alone (``mixed.restrict_to_conversation``): its rows are those over every trace, from its files only."""
    bound = [(name, bind_params(query_doc(name), params)) for name, params in asked]
    for name, values in bound:
        logger.info("query %s with %s", name, values)

    def once() -> list[pa.Table]:
        con = connect(data, threads=threads, shared_macros=False)
        try:
            if trace_id is not None:
                mixed.restrict_to_conversation(con, data, trace_id)
            return [_named_on(con, data, name, values, timeout) for name, values in bound]
        finally:
            con.close()
    return _retried(", ".join(name for name, _ in bound), once)


def _named_on(con: duckdb.DuckDBPyConnection, data: Path, name: str, values: dict[str, object],
              timeout: float | None) -> pa.Table:
    """``name``'s result on ``con`` (``run_named_together``): its stored rows, or ``store.mixed``, or its SQL."""
    one, whole = materialized.scope_flags(values)
    if not (one or whole):  # a time window's stored read calls trace_window over the refined views
        mixed.unrestrict(con, data)
    sql = queries.load(name)
    stored = freshness.named_statement(con, data, name, values)
    if stored is not None:
        sql, values = stored
    create_shared_macros(con, sql)  # those it calls, not made for a query before
    with deadline(con, timeout, name):
        if stored is None and not (one and mixed.covers(con, str(values["trace_id"]))):
            partly = mixed.read(con, data, name, sql, values)
            if partly is not None:
                return partly
            mixed.unrestrict(con, data)  # the SQL over every trace: not over views a query before restricted
        return arrow(con, sql, values or None)


def _execute(data: Path, label: str, sql: str, values: dict[str, object], limits: Limits) -> pa.Table:
    return _retried(label, lambda: _execute_once(data, label, sql, values, limits))


def _retried(label: str, run: Callable[[], _T]) -> _T:
    """``run()``, again while a file it planned with vanished under a swap (``files.rerun_if_vanished``); a DuckDB
    error is ``label``'s ``QueryFailed``."""
    try:
        return rerun_if_vanished(run)
    except duckdb.Error as e:
        raise QueryFailed(label, duckdb_message(e)) from e


def duckdb_message(error: duckdb.Error) -> str:
    """DuckDB's whole message: its "Did you mean", candidate columns and ``LINE n:`` pointer are for the user."""
    return str(error).strip() or type(error).__name__


def _execute_once(data: Path, label: str, sql: str, values: dict[str, object], limits: Limits) -> pa.Table:
    stored, con = _stored_answer(data, values, limits) if limits.named else (None, None)
    if stored is None and con is None and limits.named:  # traces wait to be stored: computed before for these files?
        stored = mixed.read_kept(data, limits.named, values, limits.threads)
    if stored is not None:
        return stored
    try:
        con = _with_views(con, data, limits.threads, private=limits.read_only)
        stored = freshness.named_statement(con, data, limits.named, values) if limits.named else None
        if stored is not None:
            sql, values = stored
        computes = bool(limits.named) and stored is None  # store.mixed makes the shared macros when it runs the SQL
        if not computes:
            create_shared_macros(con, _with_named_queries(sql) if limits.macros else sql)  # those it calls, if any
        if limits.macros:
            create_query_macros(con, sql)
        if limits.read_only:
            lock_down(con, data)
        with deadline(con, limits.timeout, label):
            partly = mixed.read_parts(con, data, str(limits.named), sql, values) if computes else None
            if partly is not None:
                return partly
            create_shared_macros(con, sql)  # those it calls, not made meanwhile
            if limits.named:  # a named query (or its stored rows' statement) is one SELECT: planned once
                return arrow(con, sql, values or None)
            relation = con.sql(sql, params=values or None)
            return pa.table({}) if relation is None else to_arrow(relation)
    finally:
        if con is not None:
            con.close()


def _with_named_queries(sql: str) -> str:
    """``sql`` and the text of each named query it mentions (whose table macro ``create_query_macros`` makes: the
    shared macros they call must be there first; its stored rows' reader calls no other than the query does)."""
    return "\n;\n".join([sql, *(queries.load(name) for name in mentioned_queries(sql))])


def _with_views(con: duckdb.DuckDBPyConnection | None, data: Path, threads: int | None,
                private: bool = False) -> duckdb.DuckDBPyConnection:
    """``con`` (the connection the stored rows were asked on, when they did not answer) with every view, or a new
    connection with them (``private``: a database of its own, which ``lock_down`` locks). The shared macros cost
    more to bind than the views (~0.15 s): ``_execute_once`` binds them only for SQL that calls them."""
    if con is None:
        return connect(data, threads=threads, shared_macros=False, private=private)
    create_views(con, data, shared_macros=False)  # the raw views made again too, over the files listed now
    return con


STORED_ATTEMPTS = 3
"""Reads of a whole store's stored rows through its current rounds before the SQL's own join is used instead."""


_Answer = tuple[pa.Table | None, duckdb.DuckDBPyConnection | None]


def _stored_answer(data: Path, values: dict[str, object], limits: Limits) -> _Answer:
    """The named query's answer from its stored rows alone, on a connection with only the views they need (a
    live poll: every view cost ~45 ms CPU of ~200 on 1M spans), through the kept current rounds for the whole
    store (``current_rounds``); (None, connection): the SQL answers, alone or in part (``store.mixed``), over
    every view, on that connection when one was made here (still open: the caller makes its other views)."""
    name = str(limits.named)
    one, whole = materialized.scope_flags(values)
    if not materialized.matches(name, values) or not (one or whole):
        return None, None  # a time window: its stored read calls a shared macro over the refined views
    if not materialized.has_rounds(data):
        return None, None  # nothing stored yet: no connection of its own (~0.1 s CPU of a poll)
    known = freshness.known_freshness(data)
    if known is not None and not known.fresh and not (one and freshness.answered(known, str(values["trace_id"]))):
        return None, None  # traces wait to be stored: no connection of its own (~0.1 s CPU of a live poll's mixed read)
    for _ in range(STORED_ATTEMPTS):
        con = connect(data, threads=limits.threads, tables=materialized.reader_tables(name), private=limits.read_only)
        answer = _read_stored(con, data, name, values, limits.timeout, whole)
        if answer is None:
            return None, con  # the stored rows do not answer (learnt here): the SQL runs on this connection
        table, current = answer
        con.close()
        if current is None or current_rounds.listing(data) == current.listing:
            return table, None
        logger.info("query %s: a round or a collection changed the stored rounds meanwhile, reading again", name)
    return None, None  # the rounds keep changing: the SQL's join of the rounds on the builds, in one statement


def _read_stored(con: duckdb.DuckDBPyConnection, data: Path, name: str, values: dict[str, object],
                 timeout: float | None, whole: bool) -> tuple[pa.Table, current_rounds.Current | None] | None:
    """``name``'s stored rows read on ``con`` and (``whole``: ``values`` pick every trace) the current rounds read
    through (None: they do not answer it). ``con`` is closed when this raises."""
    try:
        current = current_rounds.register(con, data) if whole and freshness.fresh(con, data) else None
        stored = freshness.named_statement(con, data, name, values,
                                              current=current_rounds.RELATION if current else "")
        if stored is None:
            return None
        with deadline(con, timeout, name):
            return arrow(con, stored[0], stored[1] or None), current  # planned once
    except BaseException:
        con.close()
        raise


def to_arrow(relation: duckdb.DuckDBPyRelation) -> pa.Table:
    """The relation as an Arrow table (``to_arrow_table`` in DuckDB 2, ``arrow`` before)."""
    fetch = getattr(relation, "to_arrow_table", None) or relation.arrow
    table: pa.Table = fetch()
    return table


def _jsonable(value: object) -> object:
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def _flatten_nested(table: pa.Table) -> pa.Table:
    """Replace list/struct/map columns by their JSON text, for CSV."""
    for i, field in enumerate(table.schema):
        if pa.types.is_nested(field.type):
            texts = [None if v is None else json.dumps(v, default=_jsonable) for v in table.column(i).to_pylist()]
            table = table.set_column(i, field.name, pa.array(texts, pa.string()))
    return table


def encode(table: pa.Table, fmt: str) -> bytes:
    """Encode a result as csv, json (an array of objects) or parquet bytes."""
    if fmt == "json":
        return (json.dumps(table.to_pylist(), default=_jsonable, indent=1) + "\n").encode()
    sink = io.BytesIO()
    if fmt == "csv":
        pacsv.write_csv(_flatten_nested(table), sink)
    elif fmt == "parquet":
        pq.write_table(table, sink)
    else:
        raise QueryFailed("--format", f"{fmt!r} is not one of csv, json, parquet")
    return sink.getvalue()


def write_result(table: pa.Table, fmt: str, out: IO[bytes]) -> None:
    """Write a result in ``fmt`` to a binary stream (every byte: ``files.write_all``)."""
    write_all(out, encode(table, fmt))
    out.flush()


def init_sql(data: Path) -> str:
    """Return SQL that defines every tracedag view over the Parquet files now in ``data``, and the query macros
    (over an object store: its URLs, never the local cache's copies, which may be evicted once this returns)."""
    with urls_only():
        con = connect(data)
    try:
        rows = con.execute(
            f"select sql from duckdb_views() where not internal and schema_name = 'main' and {procdb.SEEN} "
            "qualify row_number() over (partition by view_name order by database_name = current_database() desc) = 1 "
            "order by view_oid"
        ).fetchall()
        named = create_query_macros(con)
    finally:
        con.close()
    lines = [f"-- tracedag views over {data.resolve()} (regenerate with `tracedag sql --init` when tables appear)"]
    lines += [str(sql).replace("CREATE VIEW", "CREATE OR REPLACE VIEW", 1) for (sql,) in rows]
    # the table macros the named queries call (queries/_*.sql), then every named query as a table macro
    lines += [_statement(queries.load(name)) for name in queries.macro_files()]
    lines += [_statement(sql) for sql in named]
    return "\n".join(lines) + "\n"


def _statement(sql: str) -> str:
    return sql.rstrip().rstrip(";") + ";"


def write_init_file(data: Path, path: Path | None = None) -> Path:
    """Write the init SQL (``init_sql``) to ``path`` (default ``<data>/state/duckdb_init.sql``); return the path."""
    if path is None:
        path = state_dir(data) / "duckdb_init.sql"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(init_sql(data), encoding="utf-8")
    tmp.replace(path)
    return path
