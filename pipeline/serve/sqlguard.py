"""What ``POST /api/sql`` may run, decided on the parsed tree with allowlists.

``check(sql, catalog)`` parses the statement with sqlglot (DuckDB dialect) and walks every node.
A node passes only when its kind is on ``_NODES`` (queries, their clauses and expressions) or it
is a function call whose name is allowed where it stands:

- a *table* (``FROM x``, ``JOIN x``): a view of the store or a CTE of the statement (``Catalog.views``);
  never a quoted path or URL, never another catalog or schema;
- a *table function* (in ``FROM``, ``JOIN``, ``LATERAL``): ``range``, ``generate_series``, ``unnest`` and
  the store's table macros (``Catalog.macros``: the shared macros of ``queries/_*.sql`` and the
  named-query macros, e.g. ``from root_causes(per := 'conversation')``);
- a *scalar, aggregate or window function*: DuckDB's own catalogue of those, minus ``DENIED_FUNCTIONS``
  (functions that read the configuration, the session or the environment, sleep, or have a side
  effect; table functions such as ``read_text`` or ``duckdb_settings`` are never in the catalogue).

The root is a query (``SELECT``, ``WITH``, ``UNION``...), or ``DESCRIBE``/``SUMMARIZE`` of a view or
a query (not of a path). DuckDB's ``extract_statements`` must also see exactly one SELECT
(``store.sandbox.check_select``), and the worker's locked-down connection (``store.sandbox.lock_down``)
stays the second layer behind this one (RELIABILITY.md section 4).
"""

from __future__ import annotations

import functools
import re
import tempfile
from dataclasses import dataclass
from typing import Any

import duckdb
import sqlglot
from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import SqlglotError

from tracedag.pipeline.store import procdb
from tracedag.pipeline.store.sandbox import check_select
from tracedag.schemas.errors import QueryFailed

MAX_SQL_BYTES = 256 * 1024
"""Longer SQL is refused before parsing (413)."""

ALLOWED_TABLE_FUNCTIONS = frozenset({"range", "generate_series", "unnest"})

DENIED_FUNCTIONS = frozenset({
    # configuration, environment, session state
    "current_setting", "getenv", "current_query", "current_query_id", "current_connection_id",
    "current_transaction_id", "txid_current", "version", "pg_conf_load_time", "in_search_path",
    "has_database_privilege", "has_schema_privilege", "getvariable",
    # side effects: sequences, the log, waiting while holding a worker slot
    "nextval", "currval", "setval", "write_log", "sleep_ms", "pg_sleep",
    # SQL text that DuckDB would parse or run
    "json_execute_serialized_sql", "json_deserialize_sql", "json_serialize_sql",
})
"""Scalar functions refused although DuckDB lists them as scalar (decided for #29: the answer of a
query depends on the store only)."""

# Syntax that sqlglot renders with a function-call shape but DuckDB does not list as a function.
_SYNTAX_FUNCTIONS = frozenset({"cast", "try_cast", "extract", "columns", "exists", "interval", "struct_pack",
                               "if", "grouping", "coalesce", "nullif", "list_value", "array_value", "unnest"})

_NODES: tuple[type, ...] = (
    exp.Select, exp.SetOperation, exp.Subquery, exp.With, exp.CTE, exp.From, exp.Join, exp.Where,
    exp.Group, exp.Having, exp.Qualify, exp.Order, exp.Ordered, exp.Limit, exp.Offset, exp.Fetch,
    exp.Distinct, exp.Window, exp.WindowSpec, exp.Filter, exp.IgnoreNulls, exp.RespectNulls,
    exp.Alias, exp.Aliases, exp.TableAlias, exp.Table, exp.Column, exp.Identifier, exp.Star, exp.Literal,
    exp.Boolean, exp.Null, exp.DataType, exp.DataTypeParam, exp.Var, exp.Placeholder, exp.Parameter,
    exp.Tuple, exp.Array, exp.Bracket, exp.Lambda, exp.Paren, exp.Interval, exp.IntervalSpan,
    exp.Binary, exp.Unary, exp.Between, exp.In, exp.Exists, exp.Any, exp.All, exp.Values, exp.Lateral,
    exp.Unnest, exp.JSONPath, exp.JSONPathPart, exp.Slice, exp.Rollup, exp.Cube, exp.GroupingSets,
    exp.Pivot, exp.PivotAlias, exp.TableSample, exp.ColumnDef,
    exp.When, exp.Whens, exp.Case, exp.Cast, exp.Struct, exp.Kwarg, exp.Semicolon, exp.WithinGroup,
)

_TABLE_SLOTS = (exp.Table, exp.Lateral, exp.From, exp.Join)
_DUCKDB = Dialect.get_or_raise("duckdb")


@dataclass(frozen=True)
class Catalog:
    """The names a statement may read: views and table macros (lower case)."""

    views: frozenset[str]
    macros: frozenset[str]


class SqlTooLarge(QueryFailed):  # type: ignore[misc,unused-ignore]
    """The SQL text is longer than ``MAX_SQL_BYTES``."""


def catalog(con: duckdb.DuckDBPyConnection) -> Catalog:
    """The views and table macros the tracedag views made on ``con`` (``views.connect``)."""
    # what this connection sees: the process's other connections (store.procdb) have catalogs of their own
    views = con.sql(f"select lower(view_name) from duckdb_views() where not internal and {procdb.VISIBLE}").fetchall()
    macros = con.sql("select distinct lower(function_name) from duckdb_functions() "
                     f"where function_type = 'table_macro' and not internal and {procdb.VISIBLE}").fetchall()
    return Catalog(frozenset(r[0] for r in views), frozenset(r[0] for r in macros))


@functools.lru_cache(maxsize=1)
def default_catalog() -> Catalog:
    """The catalogue of an empty store: the core views and the bundled macros (no analysis outputs)."""
    from tracedag.pipeline.store.views import connect  # views imports queries; only needed here

    with tempfile.TemporaryDirectory(prefix="tracedag-guard-") as empty:
        con = connect(empty)
        try:
            return catalog(con)
        finally:
            con.close()


@functools.lru_cache(maxsize=1)
def scalar_functions() -> frozenset[str]:
    """DuckDB's scalar, aggregate, window and (scalar) macro functions, minus ``DENIED_FUNCTIONS``."""
    con = duckdb.connect(":memory:")
    try:
        rows = con.sql("select distinct lower(function_name) from duckdb_functions() "
                       "where function_type in ('scalar', 'aggregate', 'window', 'macro')").fetchall()
    finally:
        con.close()
    return frozenset(r[0] for r in rows) - DENIED_FUNCTIONS


def refuse(sql: str, names: Catalog | None = None) -> str | None:
    """Return why ``sql`` may not run on the SQL endpoint, or None when it may."""
    try:
        check(sql, names)
    except QueryFailed as e:
        return str(e)
    return None


def check(sql: str, names: Catalog | None = None) -> None:
    """Raise ``QueryFailed`` (``SqlTooLarge`` for long text) unless ``sql`` is one allowed query.

    ``names``: the store's views and macros (``catalog(con)``); the empty store's when None.
    """
    if len(sql.encode()) > MAX_SQL_BYTES:
        raise SqlTooLarge("sql", f"the SQL text is longer than {MAX_SQL_BYTES} bytes")
    tree = _parse_one(sql)
    _check_root(tree)
    known = names or default_catalog()
    for node in tree.walk():
        described = node is tree and isinstance(tree, (exp.Describe, exp.Summarize))  # the root, checked above
        reason = None if described else _node_reason(node, known)
        if reason:
            raise QueryFailed("sql", reason)
    check_select(sql, "sql")


def _parse_one(sql: str) -> Any:
    try:
        raw = _DUCKDB.tokenize(sql)  # tokenized once: the parser and the semicolon count share it
        statements = [s for s in _DUCKDB.parser().parse(raw, sql) if s is not None]
    except RecursionError as e:
        raise QueryFailed("sql", "the SQL is nested too deeply") from e
    except SqlglotError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise QueryFailed("sql", f"cannot parse: {first}") from e
    semicolons = sum(1 for t in raw if t.token_type == sqlglot.TokenType.SEMICOLON)
    if len(statements) != 1 or semicolons > 1 or (semicolons == 1 and raw[-1].token_type != sqlglot.TokenType.SEMICOLON):
        raise QueryFailed("sql", f"exactly one statement is served, got {max(len(statements), semicolons)}")
    return statements[0]


def _kind(node: Any) -> str:
    if isinstance(node, exp.Command):
        return str(node.this).upper()
    return type(node).__name__.upper()


def _check_root(tree: Any) -> None:
    if isinstance(tree, (exp.Describe, exp.Summarize)):
        target = tree.this
        if not isinstance(target, (exp.Table, exp.Query)) or (
                isinstance(target, exp.Table) and not isinstance(target.this, exp.Identifier)):
            raise QueryFailed("sql", f"{_kind(tree)} of {_kind(target)} is not served (only of a view or a query)")
        return
    if not isinstance(tree, (exp.Query, exp.Values)):
        raise QueryFailed("sql", f"only SELECT (WITH allowed) is served, not {_kind(tree)}")


def _node_reason(node: Any, names: Catalog) -> str | None:
    if isinstance(node, exp.Func):
        return _function_reason(node, names)
    if not isinstance(node, _NODES):
        return f"{_kind(node)} is not served"
    if isinstance(node, exp.Table):
        return _table_reason(node, names)
    if isinstance(node, exp.Literal) and node.is_string and node.this.lstrip().startswith("~"):
        return "'~' paths are refused"
    return None


def _table_reason(table: exp.Table, names: Catalog) -> str | None:
    if table.args.get("catalog") or table.args.get("db"):
        return "only the views of the store are served (no other catalog or schema)"
    inner = table.this
    if isinstance(inner, exp.Func):
        return None  # checked as a table function when the walk reaches it
    if isinstance(inner, exp.Identifier):
        if inner.name.lower() in names.views or _cte_in_scope(table, inner.name.lower()):
            return None
        return f"table {inner.name!r} is not a view of the store (file paths and URLs are not served)"
    return f"table {_kind(inner)} is not served"


def _cte_in_scope(table: exp.Table, name: str) -> bool:
    """Whether a WITH of an enclosing query names ``name`` (a CTE of another scope does not count)."""
    node = table.parent
    while node is not None:
        with_ = node.args.get("with_") or node.args.get("with")
        if isinstance(with_, exp.With) and any(c.alias_or_name.lower() == name for c in with_.expressions):
            return True
        node = node.parent
    return False


def _function_reason(node: exp.Func, names: Catalog) -> str | None:
    name = function_name(node)
    if isinstance(node.parent, _TABLE_SLOTS) and node.arg_key == "this":
        if name in ALLOWED_TABLE_FUNCTIONS or name in names.macros:
            return None
        return (f"table function {name} is not served (only {', '.join(sorted(ALLOWED_TABLE_FUNCTIONS))} "
                "and the store's query macros)")
    if name is None or name in _SYNTAX_FUNCTIONS or name in scalar_functions():
        return None
    if name in DENIED_FUNCTIONS:
        return f"function {name} reads the configuration, the session or has a side effect and is not served"
    return f"function {name} is not served (not a DuckDB scalar, aggregate or window function)"


_HEAD = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(\(|$)")


def function_name(node: exp.Func) -> str | None:
    """The name DuckDB sees for a function node (lower case), or None when sqlglot renders it as syntax."""
    if isinstance(node, exp.Anonymous):
        return node.name.lower()
    shallow = type(node)(**{k: _placeholder(v) for k, v in node.args.items()})
    match = _HEAD.match(shallow.sql(dialect="duckdb"))
    return match.group(1).lower() if match else None


def _placeholder(value: Any) -> Any:
    """Children replaced by a literal: rendering the head of a call costs the same at any depth."""
    if isinstance(value, (exp.DataType, exp.Literal, exp.Var, exp.Identifier, exp.Boolean, exp.Null)):
        return value
    if isinstance(value, exp.Expression):
        return exp.Literal.number(1)
    if isinstance(value, list):
        return [_placeholder(v) for v in value]
    return value
