"""DuckDB views over the Parquet tables: the public SQL interface.

``connect(data)`` returns an in-memory DuckDB connection with one view per table:
``spans``, ``evaluations``, ``traces``, ``dag_nodes``, ``dag_edges``, ``step_scores``,
``human_labels``, ``validations``. Any other ``tables/<name>/`` directory with Parquet files (analysis outputs
such as ``determinism``, ``node_utility``, ``run_paths``) is a view named ``<name>`` too.
A table without files yet is an empty view of its schema, so queries work on
an empty store. ``traces``/``dag_nodes``/``dag_edges`` show only the latest build of each trace.
Each view reads a ``<table>_all`` view of the raw files where it refines them.
The table macros of ``queries/_*.sql`` (shared by the named queries) are created after the views,
and ``query_macros.create_query_macros`` makes named queries table macros of their own names:
``select * from root_causes(per := 'conversation')``.
"""

from __future__ import annotations

import logging
import re
import tempfile
import weakref
from collections.abc import Iterable
from pathlib import Path

import duckdb
import pyarrow as pa

from tracedag.pipeline.store import freshness, materialized, procdb
from tracedag.pipeline.store.cachereads import defer_reads, local_copies, native_reads, register_reads
from tracedag.pipeline.store.files import (
    VANISHED_ATTEMPTS,
    file_vanished,
    parquet_files,
    rerun_if_vanished,
    vanished_pause,
)
from tracedag.pipeline.store.listing import SEP, cached_listing, source_uris
from tracedag.pipeline.store.query_macros import DATA_VARIABLE, create_query_macros, declare_query_macros
from tracedag.pipeline.store.remote import remote_of
from tracedag.pipeline.store.shared_macros import create_shared_macros, on_search_path
from tracedag.schemas.layout import table_dir, tables_dir
from tracedag.schemas.spans import SPANS_V1
from tracedag.schemas.tables import (
    DAG_EDGES_V1,
    DAG_NODES_V1,
    EVALUATIONS_V1,
    HUMAN_LABELS_V1,
    ROOT_CAUSE_CHECKS_V2,
    STEP_SCORES_V1,
    TRACES_V1,
    VALIDATIONS_V1,
)

SCHEMAS: dict[str, pa.Schema] = {
    "spans": SPANS_V1,
    "evaluations": EVALUATIONS_V1,
    "traces": TRACES_V1,
    "dag_nodes": DAG_NODES_V1,
    "dag_edges": DAG_EDGES_V1,
    "step_scores": STEP_SCORES_V1,
    "human_labels": HUMAN_LABELS_V1,
    "validations": VALIDATIONS_V1,
    "root_cause_checks": ROOT_CAUSE_CHECKS_V2,  # tracedag confirm; empty until a check ran
}

logger = logging.getLogger(__name__)

# Views built on the raw file views: keep only the latest build of each trace.
_LATEST = {
    # A trace split across batches may carry its conversation id on only some spans: the others
    # inherit the id of the earliest span of the trace that has one (normalize does the same
    # within a batch).
    "spans": """
        select * replace (coalesce(conversation_id, first_value(conversation_id ignore nulls) over (
                 partition by trace_id order by start_time_unix_nano
                 rows between unbounded preceding and unbounded following)) as conversation_id)
        from spans_all
    """,
    # The latest build of each trace by arg_max over a group-by (several times cheaper than a
    # row_number() window), in ONE scan of traces_all. A semi join of traces_all on its own arg_max
    # lets a trace_id filter reach the scans (one id's lookup 565 -> 300 ms on 1M spans), but a reader
    # racing a build's GC swap then saw a third of the traces missing (tests/store/test_gc.py).
    "traces": """
        select unnest(arg_max(t, (t.built_unix_nano, t.build_id))) from traces_all t group by t.trace_id
    """,
    "dag_nodes": "select n.* from dag_nodes_all n semi join traces t on n.trace_id = t.trace_id and n.build_id = t.build_id",
    "dag_edges": "select e.* from dag_edges_all e semi join traces t on e.trace_id = t.trace_id and e.build_id = t.build_id",
    # A score belongs to the build it was computed on; human labels (build_id null) always count.
    "step_scores": """
        select s.* from step_scores_all s
        where s.build_id is null
           or exists (select 1 from traces t where t.trace_id = s.trace_id and t.build_id = s.build_id)
    """,
}


def literal(text: str) -> str:
    """``text`` as a SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


# One trace's latest build, read by id (or id prefix) from traces_all alone: the comparison reaches the
# scan, so DuckDB skips every row group whose trace_id statistics cannot hold it (build files are
# sorted by trace id). ``$lo``/``$hi`` bound the prefix ('\U0010ffff' sorts after any character).
LATEST_BY_ID_SQL = """
select * from traces_all
where trace_id >= $lo and trace_id < $hi and starts_with(trace_id, $lo)
qualify row_number() over (partition by trace_id order by built_unix_nano desc, build_id desc) = 1
order by trace_id limit $n
"""


def latest_by_id(con: duckdb.DuckDBPyConnection, prefix: str, limit: int = 2) -> list[dict[str, object]]:
    """The ``traces`` rows (latest build) of the traces whose id starts with ``prefix``, by id, at most ``limit``."""
    params = {"lo": prefix, "hi": prefix + "\U0010ffff", "n": limit}
    rows: list[dict[str, object]] = con.sql(LATEST_BY_ID_SQL, params=params).to_arrow_table().to_pylist()
    return rows


def restrict_to_trace(con: duckdb.DuckDBPyConnection, trace_id: str, build_id: str) -> None:
    """Make ``con``'s refined views (``spans``, ``traces``, ``dag_nodes``, ``dag_edges``, ``step_scores``) hold
    only ``trace_id`` at its build ``build_id``: every query and macro then reads that trace's row groups only.

    The rows are those the whole-store views give for the trace when ``build_id`` is its latest build
    (``latest_by_id``); per-trace results (``failure_dag_roots`` within a trace) are unchanged.
    """
    t, b = literal(trace_id), literal(build_id)
    one = f"trace_id = {t} and build_id = {b}"
    spans = _LATEST["spans"].replace("from spans_all", f"from (select * from spans_all where trace_id = {t}) spans_all")
    bodies = {
        "spans": spans,  # the conversation id window is per trace: filtering first changes nothing
        "traces": f"select * from traces_all where {one} limit 1",
        "dag_nodes": f"select * from dag_nodes_all where {one}",
        "dag_edges": f"select * from dag_edges_all where {one}",
        "step_scores": f"select * from step_scores_all where trace_id = {t} and (build_id is null or build_id = {b})",
    }
    assert set(bodies) == set(_LATEST) and spans != _LATEST["spans"]
    forget_views(con, replacing=bodies)
    for table, body in bodies.items():
        own_view(con, table, body)


def restrict_traces(con: duckdb.DuckDBPyConnection, relation: str) -> None:
    """Make ``con``'s refined views (``spans``, ``traces``, ``dag_nodes``, ``dag_edges``, ``step_scores``) hold only
    the traces whose ids ``relation`` lists: a named query then computes the rows of those traces (whole
    conversations: a materialize round's scope). Each raw view is filtered first, so that every scan drops
    the other traces' rows before the window, joins and aggregates (restricting ``traces`` alone, as the
    other views follow it, left the named queries' scans of ``spans`` whole: 5x the CPU on 1M spans)."""
    ids = f"(select trace_id from {relation})"
    bodies = {t: body.replace(f"from {t}_all", f"from (select * from {t}_all where trace_id in {ids})", 1)
              for t, body in _LATEST.items()}
    assert all(bodies[t] != _LATEST[t] for t in _LATEST)
    forget_views(con, replacing=bodies)
    for table, body in bodies.items():
        own_view(con, table, body)


def _empty_sql(schema: pa.Schema) -> str:
    cols = ", ".join(f'cast(null as {_duck_type(f.type)}) as "{f.name}"' for f in schema)
    return f"select {cols} where false"


def _duck_type(t: pa.DataType) -> str:
    """DuckDB type text for the Arrow types our schemas use."""
    if pa.types.is_dictionary(t):
        return _duck_type(t.value_type)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "varchar"
    if pa.types.is_int8(t):
        return "tinyint"
    if pa.types.is_int32(t):
        return "integer"
    if pa.types.is_int64(t):
        return "bigint"
    if pa.types.is_floating(t):
        return "double"
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_map(t):
        return f"map({_duck_type(t.key_type)}, {_duck_type(t.item_type)})"
    if pa.types.is_list(t):
        return f"{_duck_type(t.value_type)}[]"
    if pa.types.is_struct(t):
        inner = ", ".join(f'"{f.name}" {_duck_type(f.type)}' for f in t)
        return f"struct({inner})"
    raise TypeError(f"no DuckDB type for {t}")


def _source_sql(data: Path, table: str) -> str:
    files = parquet_files(data, table)
    if not files:
        return _empty_sql(SCHEMAS[table])
    if remote_of(data) is not None:  # an object store: the files listed now, read where they are
        source = f"select * from {read_list_sql(data, files, by_name=table in _BY_NAME)}"
        if table == "spans" and len(_writers_of(files)) > 1:
            # several collectors may have stored the same span (an exporter's retry routed elsewhere):
            # one row per (trace_id, span_id), the first received
            source += " qualify row_number() over (partition by trace_id, span_id order by received_unix_nano) = 1"
        return source
    pattern = str(table_dir(data, table) / "**" / "*.parquet").replace("'", "''")
    # Every file of a core table is written with its one schema, so files are read by position:
    # union_by_name made DuckDB bind every file's columns on each query (0.6 ms a file even with
    # the footers cached: 140 ms for a count(*) over the 244 fresh files of a busy hour, 7 ms without).
    by_name = str(table in _BY_NAME).lower()
    return f"select * from read_parquet('{pattern}', union_by_name = {by_name}, hive_partitioning = false)"


_BY_NAME = {"root_cause_checks"}
"""Core tables whose files may hold an older schema version (v1 checks beside v2): read by column name."""


_DERIVED_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")


def _writers_of(files: list[Path]) -> set[str]:
    """The writers of published files (``<writer>--name``); a local file counts as this directory's."""
    return {f.name.partition(SEP)[0] if SEP in f.name else "" for f in files}


def read_list_sql(data: Path, files: list[Path], by_name: bool = False) -> str:
    """``read_parquet([...])`` of listed files of ``data`` (local paths or store URLs)."""
    uris = local_copies(data, source_uris(data, files))  # complete local copies, inside native_reads(con)
    names = ", ".join("'" + uri.replace("'", "''") + "'" for uri in uris)
    return f"read_parquet([{names}], union_by_name = {str(by_name).lower()}, hive_partitioning = false)"


def _derived_tables(data: Path) -> list[str]:
    """Table directories other than the core tables (analysis outputs) that hold Parquet files."""
    root = tables_dir(data)
    names = {d.name for d in root.iterdir() if d.is_dir()} if root.is_dir() else set()
    remote = remote_of(data)
    if remote is not None:
        names |= {t for tables in cached_listing(remote).values() for t in tables}
    reserved = set(SCHEMAS) | {f"{t}_all" for t in _LATEST}
    return sorted(n for n in names if n not in reserved and _DERIVED_NAME.match(n) and parquet_files(data, n))


def create_views(con: duckdb.DuckDBPyConnection, data: Path, shared_macros: bool = True) -> None:
    """(Re)create every view on ``con`` over the files now in ``data``, then (``shared_macros``) the shared
    query macros (``create_shared_macros``); a connection of the process's database (``procdb``) reads them
    through its search path whatever ``shared_macros`` says (``_common_macros``: nothing to bind)."""
    sql = _views_sql(con, data)
    # one call for every view: a file a swap removed fails it whole, and connect lists and makes them all again
    _make_views(con, data, sql)
    if _common_macros(con):
        return
    if shared_macros:
        create_shared_macros(con)


def _make_views(con: duckdb.DuckDBPyConnection, data: Path, sql: str) -> None:
    """Make the views ``sql`` makes on ``con``. A connection of the process's database reads them from the
    process's view set of these statements (``procdb.view_set``: made once; binding them cost ~16 ms of CPU a
    connection), the views its own catalog held dropped first (``own_view``); another makes them itself."""
    variable = f"set variable {DATA_VARIABLE} = {literal(str(data))}"
    own = procdb.catalog_of(con)
    if own is not None:
        views = procdb.view_set(con, sql)  # raises (a file a swap removed) before anything on con changed
        drops = [f"drop view if exists {own}.main.{name}" for name in sorted(_OWNED.pop(con, set()))]
        _search_path(con, views)
        con.execute(";\n".join([*drops, variable]))
    else:
        con.execute(f"{sql};\n{variable}")
    _made(con, sql)


def _search_path(con: duckdb.DuckDBPyConnection, views: str | None) -> None:
    """``con``'s search path: its own catalog, then its view set's (``views``), then the shared macros'."""
    own = procdb.catalog_of(con)
    common = procdb.common_catalog("macros", _make_common_macros)
    path = [own] if views is None else [own, views]
    con.execute(f"set search_path = '{','.join(f'{c}.main' for c in [*path, common])}'")


def own_view(con: duckdb.DuckDBPyConnection, table: str, body: str) -> None:
    """``create or replace view TABLE as BODY`` in ``con``'s own catalog, shadowing its view set's ``table`` until
    the next ``create_views``/``refresh_views`` (which drops it). Replacing a refined view: ``forget_views`` first."""
    con.execute(f"create or replace view {table} as {body}")
    _OWNED.setdefault(con, set()).add(table)


def _own_refined(con: duckdb.DuckDBPyConnection, keep: Iterable[str] = ()) -> None:
    """On a connection reading a view set: the refined views (``_LATEST``) in its own catalog, but those in ``keep``
    (the caller replaces them at once) and those it holds already. A view binds in its own catalog first, so the
    set's ``dag_nodes`` would go on reading the set's ``traces`` when the connection replaced ``traces`` alone."""
    if procdb.view_set_of(con) is None:
        return
    owned = _OWNED.get(con, set())
    for table, body in _LATEST.items():  # ``traces`` before the views that join it
        if table not in owned and table not in keep:
            own_view(con, table, body)


# The views each connection's own catalog holds over its view set (``own_view``: refined views replaced, raw views
# of ``create_raw_views``), dropped when it reads a set again (``_make_views``).
_OWNED: weakref.WeakKeyDictionary[duckdb.DuckDBPyConnection, set[str]] = weakref.WeakKeyDictionary()


def _common_macros(con: duckdb.DuckDBPyConnection) -> bool:
    """On a connection of the process's database (``procdb``): its search path reads the process's catalog of the
    shared macros after its own and its view set's (made once per process, ~45 ms CPU; a connection made them
    each before). False on a database of its own, which makes them itself."""
    if procdb.catalog_of(con) is None:
        return False
    if procdb.view_set_of(con) is None:  # its views are its own (``_make_views`` set the path otherwise)
        _search_path(con, None)
    on_search_path(con)
    return True


def _make_common_macros(con: duckdb.DuckDBPyConnection) -> None:
    """Every shared macro on ``con``, bound over the views of an empty store: of every core table, in the schema a
    connection's views have (a body binds again over the caller's views where it is called)."""
    with tempfile.TemporaryDirectory(prefix="tracedag-macros-") as empty:
        create_views(con, Path(empty))


# The statements ``create_views`` last ran on each connection, while its views are still those they made
# (``refresh_views`` compares; a restriction of the refined views forgets them).
_VIEWS: weakref.WeakKeyDictionary[duckdb.DuckDBPyConnection, str] = weakref.WeakKeyDictionary()


_STATE_VIEW = f"create or replace view {materialized.STATE} as "


def _made(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    """Remember that ``con``'s views are those ``sql`` made (``refresh_views``), and tell ``freshness`` when they
    include the state's view (it then asks no catalog)."""
    _VIEWS[con] = sql
    if _STATE_VIEW in sql:
        freshness.know_state_view(con)


def _views_sql(con: duckdb.DuckDBPyConnection, data: Path) -> str:
    """The statements making every view over the files now in ``data`` (``create_views``), in one text."""
    with native_reads(con):  # a store's objects cached whole are read as local files, pinned for con's life
        statements = [_raw_view_sql(data, table) for table in SCHEMAS]
        statements += [f"create or replace view {table} as {_LATEST[table]}" for table in _LATEST]
        statements += [_derived_view_sql(data, table) for table in _derived_tables(data)]
    return ";\n".join(statements)


def refresh_views(con: duckdb.DuckDBPyConnection, data: Path) -> bool:
    """Make ``con``'s views (``create_views``') read the tables of ``data`` as they are now; return whether any
    was made again.

    A local store's views glob their table's directory each time a query is planned, so the files written or
    removed since the views were made are read without this. What a view does not follow is a change of its
    statement: a core table that had no files (its view was an empty relation of its schema) has some, a derived
    table appeared or went, or the store is an object store (its views list the files). Then, or when the refined
    views were restricted since (``restrict_traces``, ``forget_views``), every view is made again, as
    ``create_views`` makes them (~25 ms CPU; a new connection with them costs ~50 ms). Comparing costs a
    listing of the table directories (~1 ms). The shared macros are not touched.
    """
    def once() -> bool:  # again on a new listing when a GC or compaction swap removed a file meanwhile
        sql = _views_sql(con, data)
        if _VIEWS.get(con) == sql:
            return False
        _VIEWS.pop(con, None)
        _make_views(con, data, sql)
        return True
    return rerun_if_vanished(once)


def forget_views(con: duckdb.DuckDBPyConnection, replacing: Iterable[str] = ()) -> None:
    """Before a caller makes ``con``'s refined views read a copy or a part (with ``own_view``): the refined views it
    does not replace (``replacing``) become its own too, so that they read those it does; the next
    ``refresh_views`` makes every view again."""
    _own_refined(con, keep=set(replacing))
    _VIEWS.pop(con, None)


def create_raw_views(con: duckdb.DuckDBPyConnection, data: Path, tables: Iterable[str]) -> None:
    """(Re)create on ``con`` only the raw views of ``tables``: ``<table>_all`` of a core table the views refine
    (``spans``, ``traces``, ``dag_nodes``, ``dag_edges``, ``step_scores``), the view of another core table
    or of a derived table with files (none for a derived table without files). No refined view, no macro.

    For a reader of one trace, which makes the refined views it reads itself (``restrict_to_trace``):
    binding a view costs 1-5 ms CPU, and ``create_views`` binds ~20 of them on a scored store.
    """
    wanted = list(dict.fromkeys(tables))
    with native_reads(con, wanted):  # the first lookup lists these tables' folders only
        made = [t for t in wanted if t in SCHEMAS or (_DERIVED_NAME.match(t) and parquet_files(data, t))]
        statements = [_raw_view_sql(data, t) if t in SCHEMAS else _derived_view_sql(data, t) for t in made]
    _own_refined(con)  # these raw views shadow its view set's: its refined views must read them
    con.execute(";\n".join([*statements, f"set variable {DATA_VARIABLE} = {literal(str(data))}"]))
    _OWNED.setdefault(con, set()).update(_raw_name(t) for t in made)  # as ``own_view`` records its views


def _raw_name(table: str) -> str:
    """The name of ``table``'s raw view: ``<table>_all`` when a refined view reads it, else the table's."""
    return f"{table}_all" if table in _LATEST else table


def _raw_view_sql(data: Path, table: str) -> str:
    """The statement making the raw view of the core table ``table`` (``<table>_all`` when it is refined)."""
    return f"create or replace view {_raw_name(table)} as {_source_sql(data, table)}"


def _derived_view_sql(data: Path, table: str) -> str:
    """The statement making the view of the derived table ``table`` (its files read by column name)."""
    if remote_of(data) is not None:
        source = read_list_sql(data, parquet_files(data, table), by_name=True)
        return f"create or replace view {table} as select * from {source}"
    pattern = str(table_dir(data, table) / "**" / "*.parquet").replace("'", "''")
    return (f"create or replace view {table} as select * from read_parquet('{pattern}', "
            "union_by_name = true, hive_partitioning = false)")


def connect(data: Path | str, threads: int | None = None, query_macros: bool = False,
            declare_macros: bool = False, shared_macros: bool = True,
            tables: Iterable[str] | None = None, private: bool = False) -> duckdb.DuckDBPyConnection:
    """Return an in-memory DuckDB connection with the tracedag views over ``data`` (a path or a string).

    ``query_macros``: also make every named query a table macro (``create_query_macros``; ~0.1 s CPU).
    ``declare_macros``: only their wrappers, bodies to come (``declare_query_macros``).
    ``shared_macros``: False leaves out the macros of ``queries/_*.sql`` (``create_shared_macros`` makes them) on a
    database of its own; a connection of the process's database reads them anyway, made once per process.
    ``tables``: only the raw views of these tables (``create_raw_views``), no macro; ``create_views`` makes the rest.
    ``private``: a database of its own, for a caller that sets a global setting on it (``threads``, ``memory_limit``,
    ``temp_directory``, ...). Otherwise the connection is one of the process's database (``procdb``: its views and
    macros its own, the database's settings shared; ~12 ms of CPU less), except with ``threads`` or over an object
    store (its filesystem is registered on the database), which get their own too.
    """
    if tables is not None and (query_macros or declare_macros):
        raise ValueError("the named queries' macros read the refined views: connect with every view")
    wanted = None if tables is None else list(tables)
    remote = remote_of(Path(data))
    # a database of its own is closed at the process's exit if its caller keeps it that long (procdb's docstring)
    own = private or threads or remote is not None
    con = procdb.close_at_exit(duckdb.connect(":memory:")) if own else procdb.connection()
    if threads:
        con.execute(f"set threads = {int(threads)}")
    if remote is not None:  # through fsspec and the local object cache, once a statement names a URL
        defer_reads(con, remote)
        if query_macros or declare_macros:  # SQL of any kind to come (a console, the SQL endpoint)
            register_reads(con)
    for attempt in range(1, VANISHED_ATTEMPTS + 1):
        try:
            if wanted is None:
                create_views(con, Path(data), shared_macros)  # the shared macros bind over the views: they open files
            else:
                create_raw_views(con, Path(data), wanted)
            break
        except duckdb.IOException as e:  # a GC or compaction swap removed one meanwhile: list again
            if attempt == VANISHED_ATTEMPTS or not file_vanished(e):
                raise
            vanished_pause(attempt)
    if query_macros:
        create_query_macros(con)
    elif declare_macros:
        declare_query_macros(con)
    return con
