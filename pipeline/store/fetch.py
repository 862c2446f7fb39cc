"""A query's rows as Arrow, planned once.

``con.sql(query).to_arrow_table()`` plans a query twice: the relation binds it when it is made (its columns), and
binds, optimizes and runs it again when its rows are fetched. A scorer's queries are mostly planning on a round's
few traces (binding a stored query over the shared macros is ~30 % of its planning): ``con.execute(query)`` plans
it once. DuckDB 2 then warns that its Arrow output of a DB-API result copies the rows once more: that costs less
than the second bind for a result of a few MB (the stored queries' results of a round: 10,661 traces' ``trace_summary``,
2.9 MB, 238 -> 209 ms CPU), more for a large one (the rule pass's scan of 40k spans, 16 MB: 366 -> 409 ms), which
keeps the relation's fetch.

Here, in the store, so that ``querying`` fetches a named query's rows so too; the scorer imports it from here.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import duckdb
import pyarrow as pa

_MODULE = r"tracedag\.pipeline\.store\.fetch\Z"


def _quiet() -> None:
    """Silence DuckDB's warning of the copy for this module's calls only (it knows), again when a ``catch_warnings``
    (a test's) dropped the filter since: a filter made at import would not outlive the first test that imports it."""
    if not any(f[0] == "ignore" and f[3] is not None and f[3].pattern == _MODULE for f in warnings.filters):
        warnings.filterwarnings("ignore", message="Arrow output on a DB-API result", category=UserWarning,
                                module=_MODULE)


def arrow(con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, Any] | list[Any] | None = None) -> pa.Table:
    """``sql``'s rows (with ``params``: ``$name`` or ``?`` values) as an Arrow table, planned once."""
    _quiet()
    cursor = con.execute(sql) if params is None else con.execute(sql, params)
    # DuckDB 2 names it to_arrow_table, 1 fetch_arrow_table (the stubs know one)
    fetch: Callable[[], pa.Table] = getattr(cursor, "to_arrow_table", None) or getattr(cursor, "fetch_arrow_table")  # noqa: B009
    table = fetch()
    return table
