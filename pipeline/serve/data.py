"""What the server reads from a store: named queries, the trace list, one trace in full.

Results are cached per *build state*: ``state_key(data)`` (``statekey``) is the list of Parquet files under
``tables/`` with their sizes and modification times (one directory walk, no Parquet read). A
build, a scoring round, a conversion or a compaction changes it; until then a repeated request is
answered from memory. SQL is built only with bound parameters.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from tracedag.pipeline.serve import encode, tracefiles
from tracedag.pipeline.serve.cache import ResultCache
from tracedag.pipeline.serve.statekey import state_key
from tracedag.pipeline.store import files, freshness, materialized, sqlfiles
from tracedag.pipeline.store.fetch import arrow
from tracedag.pipeline.store.files import VANISHED_ATTEMPTS
from tracedag.pipeline.store.querying import bind_params, run_named, run_named_together
from tracedag.pipeline.store.views import connect
from tracedag.schemas.errors import QueryFailed, TracedagError

if TYPE_CHECKING:  # the guard imports sqlglot (~0.1 s CPU): only POST /api/sql's worker parses SQL
    from tracedag.pipeline.serve.sqlguard import Catalog

logger = logging.getLogger(__name__)

WHOLE_CACHE_BYTES = 512 << 20
"""Budget of whole-store results (named queries over every trace, the trace list, /metrics)."""
TRACE_CACHE_BYTES = 128 << 20
"""Budget of single-trace documents (their JSON bodies)."""
_T = TypeVar("_T")


class NotFound(TracedagError):  # type: ignore[misc,unused-ignore]
    """No built trace has this id."""


class Store:
    """The server's view of one data directory.

    Two result caches, each bounded in bytes: ``cache`` for whole-store results (named queries,
    the trace list, the id set, /metrics) and ``trace_cache`` for single traces, so viewing many
    traces never evicts what every page needs.
    """

    def __init__(self, data: Path, cache_bytes: int = WHOLE_CACHE_BYTES,
                 trace_cache_bytes: int = TRACE_CACHE_BYTES) -> None:
        self.data = Path(data)
        self.cache = ResultCache(cache_bytes)
        self.trace_cache = ResultCache(trace_cache_bytes)
        self._con: tuple[str, duckdb.DuckDBPyConnection, bool] | None = None
        self._con_lock = threading.Lock()

    def state(self) -> str:
        return state_key(self.data)

    def _cursor(self, state: str) -> duckdb.DuckDBPyConnection:
        """A cursor on this build state's connection (the views are made once per state, not per request)."""
        return self._connected(state)[0]

    def _connected(self, state: str) -> tuple[duckdb.DuckDBPyConnection, bool]:
        """``_cursor(state)`` and whether its connection has the view of the stored rows' state for sure: a round's
        state files were listed before it connected (``connect`` makes a view of every table with files; asking
        the connection's catalog, ``freshness.has_state_view``, cost ~7 ms CPU on each new connection)."""
        with self._con_lock:
            if self._con is None or self._con[0] != state:
                rounds = materialized.has_rounds(self.data)
                con = connect(self.data, private=True)  # a global setting below
                # a published file never changes under its name (a new build state makes a new
                # connection anyway): its footer is parsed once, not per request (one trace's parts 3-5x).
                # Global: every request reads on a cursor, a connection of its own that a session setting
                # does not reach (the spans read parsed its 31 footers again each time: ~35 ms CPU on 1M spans)
                con.execute("set global parquet_metadata_cache = true")
                self._con = (state, con, rounds)
            return self._con[1].cursor(), self._con[2]

    def catalog(self) -> Catalog:
        """The views and table macros of the store (what ``POST /api/sql`` may read), once per build state."""
        state = self.state()
        names: Catalog = self.cache.get(state, "catalog", lambda: _catalog_of(self._cursor(state)))
        return names

    def trace_ids(self, state: str | None = None) -> frozenset[str]:
        """The ids of every built trace (one column read per build state): an unknown id costs a set lookup."""
        state = state or self.state()
        ids: frozenset[str] = self.cache.get(state, "trace_ids", lambda: self.on_state(state, _ids))
        return ids

    def on_state(self, state: str, read: Callable[[duckdb.DuckDBPyConnection], _T]) -> _T:
        """``read(cursor)`` on the connection of the build state ``state`` (a request reads one state:
        walking the directory again for each part cost ~5 ms under load); when a file it planned with
        vanished (a collection swapped files since), again on the state now."""
        return self._on_connection(state, lambda cur, _: read(cur))

    def _on_connection(self, state: str, read: Callable[[duckdb.DuckDBPyConnection, bool], _T]) -> _T:
        """``on_state``, ``read`` given too whether the connection has the state view for sure (``_connected``)."""
        states = iter([state])

        def attempt() -> _T:
            cur, rounds = self._connected(next(states, None) or self.state())
            try:
                return read(cur, rounds)
            finally:
                cur.close()
        return rerun_if_vanished(attempt)

    def named(self, name: str, params: Mapping[str, str], since: str | None) -> pa.Table:
        """A named query's result (cached per build state; a relative ``since`` is not cached)."""
        key = _whole_key(name, params, since)
        if since is not None:
            return run_named(self.data, name, params, since)
        result: pa.Table = self.cache.get(self.state(), key, lambda: run_named(self.data, name, params, None))
        return result

    def _named_tables(self, names: tuple[str, ...], params: Mapping[str, str], state: str) -> dict[str, pa.Table]:
        """The results of ``names`` for a document: each query over every trace when it is cached for this build
        state (then filtered), or one trace's stored rows; the rest run narrowed, on one connection for them all
        (``run_named_together``: a connection and the shared macros for each cost ~0.17 s CPU)."""
        found = {name: self._whole(name, params, state) for name in names}
        if "trace_id" in params:
            found.update(self._stored_all([name for name, table in found.items() if table is None], params, state))
        todo = [name for name, table in found.items() if table is None]
        if todo and "trace_id" in params:
            ran = run_named_together(self.data, [(name, params) for name in todo], trace_id=params["trace_id"])
            found.update(zip(todo, ran, strict=True))
        tables = {name: table if table is not None else run_named(self.data, name, params)
                  for name, table in found.items()}
        return tables

    def _whole(self, name: str, params: Mapping[str, str], state: str) -> pa.Table | None:
        """The query over every trace when it is cached for this build state (filtered to ``params``' trace); None:
        not cached (or ``params`` other than a trace)."""
        whole = self.cache.peek(state, _whole_key(name))
        if whole is not None and "trace_id" in params:
            table: pa.Table = whole.filter(pc.equal(whole["trace_id"], params["trace_id"]))
            return table
        return whole if not params else None

    def _stored(self, name: str, params: Mapping[str, str], state: str) -> pa.Table | None:
        """One trace's materialized rows of ``name``, read on this build state's connection (None: not stored)."""
        return self._stored_all([name], params, state)[name]

    def _stored_all(self, names: list[str], params: Mapping[str, str], state: str) -> dict[str, pa.Table | None]:
        """One trace's materialized rows of each of ``names``, read on this build state's connection (None: not
        stored); the store's freshness and the trace's newest round are asked once for them all."""
        if not names:
            return {}
        wanted = [(name, bind_params(sqlfiles.described(name), params)) for name in names]

        def read(cur: duckdb.DuckDBPyConnection, rounds: bool) -> dict[str, pa.Table | None]:
            stored = freshness.named_statements(cur, self.data, wanted, has_view=rounds or None)
            return {name: None if s is None else arrow(cur, s[0], s[1])
                    for name, s in zip(names, stored, strict=True)}
        return self._on_connection(state, read)

    def warm(self) -> None:
        """Compute the whole-store results the list, a trace and /metrics read (once per build state), after the
        row group filters of the files a trace's parts read (``tracefiles.prime``: a file's are read once).

        The queries not cached yet run on one connection (``run_named_together``: a connection each cost ~25 ms
        CPU of a server's start on a small store), under the trace list's cache entry, so a first /api/traces
        meanwhile waits for it instead of computing it again."""
        tracefiles.prime(self.data, PART_TABLES)
        state = self.state()
        first, *rest = _WARMED
        others: dict[str, pa.Table] = {}

        def together() -> pa.Table:
            names = [first, *(name for name in rest if self.cache.peek(state, _whole_key(name)) is None)]
            tables = run_named_together(self.data, [(name, {}) for name in names])
            others.update(zip(names[1:], tables[1:], strict=True))
            return tables[0]
        self.cache.get(state, _whole_key(first), together)
        for name in rest:
            if name in others:
                self.cache.get(state, _whole_key(name), functools.partial(others.pop, name))
            else:
                self.named(name, {}, None)

    def traces(self, since: str | None = None, status: str | None = None, agent: str | None = None,
               conversation: str | None = None, limit: int = 200, offset: int = 0) -> tuple[int, pa.Table]:
        """The trace list (``trace_summary``), filtered, newest first: (matching count, one page)."""
        table = self.named("trace_summary", {}, since)
        mask = None
        conditions = []
        if status in ("passed", "failed"):
            conditions.append(pc.equal(table["passed"], status == "passed"))
        elif status == "error":
            conditions.append(pc.greater(table["error_count"], 0))
        if agent:
            conditions.append(pc.equal(table["service_name"], agent))
        if conversation:
            conditions.append(pc.equal(table["conversation_id"], conversation))
        for c in conditions:
            mask = c if mask is None else pc.and_(mask, c)
        if mask is not None:
            table = table.filter(pc.fill_null(mask, False))
        table = table.sort_by([("start_time_unix_nano", "descending"), ("trace_id", "ascending")])
        return table.num_rows, table.slice(offset, limit)

    def trace(self, trace_id: str, state: str | None = None) -> dict[str, Any]:
        """One trace: its summary, spans, DAG nodes (with score) and edges, scores, failures, root cause."""
        doc: dict[str, Any] = json.loads(self.trace_json(trace_id, state))
        return doc

    def trace_json(self, trace_id: str, state: str | None = None) -> bytes:
        """``trace`` as the JSON body the API sends, cached per build state apart from whole-store results."""
        state = state or self.state()
        if trace_id not in self.trace_ids(state):
            raise NotFound(f"trace {trace_id}: not built (run `tracedag build`, or wait for the idle time)")
        body: bytes = self.trace_cache.get(state, trace_id, lambda: encode.dumps(self._trace(trace_id, state)))
        return body

    def _trace(self, trace_id: str, state: str) -> dict[str, Any]:
        docs = self.documents([trace_id], {"trace_id": trace_id}, state)
        if trace_id not in docs:
            raise NotFound(f"trace {trace_id}: not built (run `tracedag build`, or wait for the idle time)")
        return docs[trace_id]

    def documents(self, trace_ids: list[str], params: Mapping[str, str] | None = None,
                  state: str | None = None) -> dict[str, dict[str, Any]]:
        """The full documents of several traces, each query run once for all of them.

        ``params`` narrows the named queries (``trace_id`` for one trace); without it they run over
        every trace and the rows of ``trace_ids`` are kept.
        """
        p = dict(params or {})
        wanted = set(trace_ids)
        state = state or self.state()

        def grouped(rows: list[dict[str, Any]], key: str = "trace_id") -> dict[str, list[dict[str, Any]]]:
            out: dict[str, list[dict[str, Any]]] = {}
            for r in rows:
                if r[key] in wanted:
                    out.setdefault(r[key], []).append(r)
            return out

        named = self._named_tables(("trace_summary", "propagation", "root_causes"), p, state)
        summary = grouped(named["trace_summary"].to_pylist())
        failures = grouped(named["propagation"].to_pylist())
        roots = grouped(named["root_causes"].to_pylist())
        parts = {name: grouped(rows) for name, rows in self._parts(sorted(wanted), state).items()}
        docs = {}
        for tid in trace_ids:
            if tid not in summary:
                continue
            root = roots.get(tid, [None])[0]
            fails = failures.get(tid, [])
            docs[tid] = {"trace": summary[tid][0], **{k: [_drop(r) for r in v.get(tid, [])] for k, v in parts.items()},
                         "failures": fails, "root_cause": root, "propagation_chain": _chain(root, fails)}
        return docs


    def _parts(self, trace_ids: list[str], state: str) -> dict[str, list[dict[str, Any]]]:
        """The nodes, edges, spans and scores rows of ``trace_ids`` (re-run when compaction removed a file)."""
        def read(cur: duckdb.DuckDBPyConnection) -> dict[str, list[dict[str, Any]]]:
            latest = cur.sql(_LATEST_SQL, params={"t": trace_ids}).fetchall()
            values = {"t": trace_ids, "lt": [r[0] for r in latest], "lb": [r[1] for r in latest]}
            # only the files that may hold the traces (listed again when a read is planned again)
            sources = tracefiles.sources(self.data, PART_TABLES, trace_ids)
            parts = {name: _part(cur, sql, sources[table], values) for name, (table, sql) in _TRACE_SQL.items()}
            scored(parts["nodes"], parts["scores"])
            return parts
        return self.on_state(state, read)


_WARMED = ("trace_summary", "propagation", "root_causes")
"""The whole-store results ``Store.warm`` computes (the trace list first: its request waits for it)."""


def _whole_key(name: str, params: Mapping[str, str] | None = None, since: str | None = None) -> str:
    """The cache key of a named query's result (``Store.named``)."""
    return repr((name, sorted((params or {}).items()), since))


def _part(cur: duckdb.DuckDBPyConnection, sql: str, source: str | None, values: dict[str, list[str]]) -> list[dict[str, Any]]:
    """The rows of one part of a trace read from ``source`` (None: no file holds the trace: none)."""
    if source is None:
        return []
    query = sql.format(source=source)
    rows: list[dict[str, Any]] = arrow(cur, query, {k: v for k, v in values.items() if f"${k}" in query}).to_pylist()
    return rows


def _ids(cur: duckdb.DuckDBPyConnection) -> frozenset[str]:
    return frozenset(r[0] for r in cur.sql("select distinct trace_id from traces_all").fetchall())


def _catalog_of(cur: duckdb.DuckDBPyConnection) -> Catalog:
    from tracedag.pipeline.serve.sqlguard import catalog

    try:
        return catalog(cur)
    finally:
        cur.close()


def rerun_if_vanished(read: Callable[[], _T], attempts: int = VANISHED_ATTEMPTS) -> _T:
    """``read()``, planned again while compaction removed a file it listed (``files.rerun_if_vanished``); a
    DuckDB IO error left after that is the request's ``QueryFailed``."""
    try:
        return files.rerun_if_vanished(read, attempts)
    except duckdb.IOException as e:
        raise QueryFailed("trace", str(e).strip().splitlines()[0]) from e


def scored(nodes: list[dict[str, Any]], scores: list[dict[str, Any]]) -> None:
    """Give each node its ``score`` (the lowest of its score rows) and ``metrics`` (how many rows; both None
    without rows), from the trace's ``scores`` part: one read of the scores for both parts."""
    rows: dict[tuple[str, str], list[Any]] = {}
    for r in scores:
        rows.setdefault((r["trace_id"], r["span_id"]), []).append(r["score"])
    for n in nodes:
        found = rows.get((n["trace_id"], n["span_id"]))
        given = [float(v) for v in found or [] if v is not None]
        n["score"] = min(given) if given else None
        n["metrics"] = len(found) if found else None


def _drop(row: dict[str, Any]) -> dict[str, Any]:
    row.pop("trace_id", None)
    return row


def _chain(root: dict[str, Any] | None, failures: list[dict[str, Any]]) -> list[str]:
    """Span ids from the root cause to the trace's final failure, following the failing-upstream links."""
    if root is None:
        return []
    by_span = {f["span_id"]: f for f in failures}
    chain = [root["failed_span_id"]]
    seen = set(chain)
    target = root["root_span_id"]
    while chain[-1] != target:
        ups = by_span.get(chain[-1], {}).get("failing_upstream") or []
        nxt = next((u for u in ups if u == target), None) or next((u for u in reversed(ups) if u not in seen), None)
        if nxt is None:
            break
        chain.append(nxt)
        seen.add(nxt)
    if chain[-1] != target:
        chain.append(target)
    return list(reversed(chain))


# The latest build of each wanted trace, read from the raw view with the trace filter pushed down (the
# ``traces``/``dag_nodes`` views pick the latest build of every trace first: 8x slower for one); once per
# request, the parts then read the rows of those (trace, build) pairs (``$lt``/``$lb``; each part computing it
# again cost ~10 ms CPU more of a trace's first view on 1M spans).
_LATEST_SQL = """
select trace_id, arg_max(build_id, (built_unix_nano, build_id)) as build_id
from traces_all where trace_id in (select unnest($t)) group by trace_id
"""
_PAIRS = "(select unnest($lt::varchar[]) as trace_id, unnest($lb::varchar[]) as build_id)"

_TRACE_SQL = {
    "nodes": ("dag_nodes", f"""
        select n.trace_id, n.span_id, n.parent_span_id, n.step_type, n.step_name, n.step_key, n.iteration,
               n.is_retry, n.depth, n.topo_index, n.status_code, n.start_time_unix_nano,
               n.duration_ns / 1e6 as duration_ms
        from {{source}} n semi join {_PAIRS} l using (trace_id, build_id)
        where n.trace_id in (select unnest($lt::varchar[]))
        order by n.trace_id, n.nested_left
    """),
    "edges": ("dag_edges", f"""
        select e.trace_id, e.upstream_span_id as source, e.downstream_span_id as target, e.edge_kind
        from {{source}} e semi join {_PAIRS} l using (trace_id, build_id)
        where e.trace_id in (select unnest($lt::varchar[]))
        order by e.trace_id, source, target
    """),
    "spans": ("spans", """
        select trace_id, span_id, parent_span_id, name, kind, status_code, status_message, step_type, step_name,
               agent_name, tool_name, model, input_tokens, output_tokens, error_type,
               input_text, output_text, attributes::json::varchar as attributes,
               start_time_unix_nano, duration_ns / 1e6 as duration_ms
        from {source} where trace_id in (select unnest($t)) order by trace_id, start_time_unix_nano, span_id
    """),
    # A score belongs to the build it was computed on; human labels (build_id null) always count.
    "scores": ("step_scores", f"""
        select s.trace_id, s.span_id, s.metric, s.score, s.label, s.source, s.rule_name, s.explanation,
               s.taxonomy_l1, s.taxonomy_l2, s.taxonomy_l3
        from {{source}} s
        where s.trace_id in (select unnest($t))
          and (s.build_id is null or exists (select 1 from {_PAIRS} l
                                             where l.trace_id = s.trace_id and l.build_id = s.build_id))
        order by s.trace_id, s.span_id, s.metric
    """),
}
"""Each part of a trace document: the table it reads and its SQL over ``{source}`` (``tracefiles.sources``: the
files of the table that may hold the traces, or an object store's raw view)."""
PART_TABLES = tuple(dict.fromkeys(table for table, _ in _TRACE_SQL.values()))
"""The tables a trace's parts read."""
