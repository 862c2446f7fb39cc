"""The refusal list of ``POST /api/sql``: one SELECT that reads the store's views and nothing else.

``refuse(sql)`` returns the reason a statement may not run, or None. Two parsers must agree:
sqlglot (the DuckDB dialect) sees the statement's shape, DuckDB's own ``extract_statements``
(``store.sandbox.check_select``) sees what DuckDB would run. Refused: more than one statement,
anything but a query (COPY, ATTACH, INSTALL/LOAD, PRAGMA, SET/RESET, CALL, CHECKPOINT, EXPORT,
EXPLAIN, CREATE ...), table functions other than ``range``/``generate_series``/``unnest``
(``read_text``, ``read_csv``, ``glob``, ``parquet_metadata``, ``sniff_csv``, ``query_table``...),
file-reading scalar functions, a table named by a path or URL (``FROM '/etc/passwd'``), ``~``
paths, and SQL text above ``MAX_SQL_BYTES``. The worker's locked-down connection
(``store.sandbox.lock_down``) is the second layer behind this list (RELIABILITY.md section 4).
"""

from __future__ import annotations

import re
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from tracedag.pipeline.store.sandbox import check_select
from tracedag.schemas.errors import QueryFailed

MAX_SQL_BYTES = 256 * 1024
"""Longer SQL is refused before parsing (413)."""

ALLOWED_TABLE_FUNCTIONS = frozenset({"range", "generate_series", "unnest"})
_PLAIN_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_FILE_FUNCTION = re.compile(
    r"^(read_\w*|parquet_\w*|sniff_csv|glob|query|query_table|iceberg_\w*|delta_\w*|getenv|"
    r"duckdb_secrets|which_secret|current_setting|load_extension|json_execute_serialized_sql)$", re.I)
_ALLOWED_ROOTS = (exp.Query, exp.Describe, exp.Summarize)


class SqlTooLarge(QueryFailed):  # type: ignore[misc,unused-ignore]
    """The SQL text is longer than ``MAX_SQL_BYTES``."""


def refuse(sql: str) -> str | None:
    """Return why ``sql`` may not run on the SQL endpoint, or None when it may."""
    try:
        check(sql)
    except QueryFailed as e:
        return str(e)
    return None


def check(sql: str) -> None:
    """Raise ``QueryFailed`` (``SqlTooLarge`` for long text) unless ``sql`` is one harmless SELECT."""
    if len(sql.encode()) > MAX_SQL_BYTES:
        raise SqlTooLarge("sql", f"the SQL text is longer than {MAX_SQL_BYTES} bytes")
    tree = _parse_one(sql)
    if not isinstance(tree, _ALLOWED_ROOTS):
        raise QueryFailed("sql", f"only SELECT (WITH allowed) is served, not {_kind(tree)}")
    for node in tree.walk():
        reason = _node_reason(node)
        if reason:
            raise QueryFailed("sql", reason)
    check_select(sql, "sql")


def _parse_one(sql: str) -> Any:
    try:
        statements = [s for s in sqlglot.parse(sql, dialect="duckdb") if s is not None]
        raw = sqlglot.tokenize(sql, dialect="duckdb")
    except RecursionError as e:
        raise QueryFailed("sql", "the SQL is nested too deeply") from e
    except SqlglotError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise QueryFailed("sql", f"cannot parse: {first}") from e
    semicolons = sum(1 for t in raw if t.token_type == sqlglot.TokenType.SEMICOLON)
    if len(statements) != 1 or semicolons > 1 or (semicolons == 1 and raw[-1].token_type != sqlglot.TokenType.SEMICOLON):
        raise QueryFailed("sql", f"exactly one statement is served, got {max(len(statements), semicolons)}")
    return statements[0]


def _kind(tree: Any) -> str:
    if isinstance(tree, exp.Command):
        return str(tree.this).upper()
    return type(tree).__name__.upper()


def _node_reason(node: Any) -> str | None:
    if isinstance(node, exp.Table):
        return _table_reason(node)
    if isinstance(node, exp.Func):
        name = node.sql_name() if not isinstance(node, exp.Anonymous) else str(node.this)
        if _FILE_FUNCTION.match(name):
            return f"function {name.lower()} reads files or settings and is not served"
    if isinstance(node, exp.Literal) and node.is_string and node.this.lstrip().startswith("~"):
        return "'~' paths are refused"
    if isinstance(node, (exp.Command, exp.Copy, exp.Attach, exp.Set, exp.Pragma, exp.Create, exp.Insert,
                         exp.Update, exp.Delete, exp.Drop, exp.Merge)):
        return f"{_kind(node)} is not served"
    return None


def _table_reason(table: exp.Table) -> str | None:
    inner = table.this
    if isinstance(inner, exp.Func):
        name = (str(inner.this) if isinstance(inner, exp.Anonymous) else inner.sql_name()).lower()
        if name in ALLOWED_TABLE_FUNCTIONS:
            return None
        return f"table function {name} is not served (only {', '.join(sorted(ALLOWED_TABLE_FUNCTIONS))})"
    if isinstance(inner, exp.Identifier) and not _PLAIN_NAME.match(inner.name):
        return f"table {inner.name!r} is not a view name (file paths and URLs are not served)"
    if table.args.get("catalog") or (table.args.get("db") and table.db.lower() not in ("main",)):
        return "only the views of the store are served (no other catalog or schema)"
    return None
