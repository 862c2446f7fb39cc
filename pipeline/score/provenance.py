"""Value provenance: ``data`` edges into the failed tool steps of the traces just scored.

A failed tool step's argument values are matched against what came before it in its conversation:
the outputs of the steps of its own trace that ended before it started, the outputs of every step of
the earlier turns (traces of the same ``conversation_id`` that started before), and the user message
of each of those turns (the ``input_text`` of the turn's earliest model call, else of its root span:
the rule ``replay.source`` reads user turns by). The earliest place a value appears (by turn, then by
time: a producer's end, a user message's start) is its producer, and one ``dag_edges`` row of kind
``data`` goes from the producer to the failed step (``src_trace_id``: the producer's trace,
``data_arg``: the argument, ``data_from``: ``output`` or ``user``). The model step that wrote the call
(its ``tool_call`` edge) is not a producer: a value first seen there was made up, which PARAMGEN reads.
``root_causes`` decides from the failure's text whether the value was what failed (``silent_producer``).

Which argument values are matched (``matchable``): a JSON leaf of the step's input (its arguments; a
non-JSON input is one value named ``input``), trimmed, without whitespace, at most 512 characters, and

- a URL (``scheme://...``), or
- a number with at least 3 digits (``1042``, ``-12.5``), or
- at least 4 characters with a digit in them (``A1042``, ``1Z999AA10123456784``, ``2026-05-03``), or
- an identifier: at least 6 characters, letters/digits joined by ``_ - . : @ / #``, or camelCase;

and not a stop word (``STOP_WORDS``: generic tokens such as ``utf-8``, ``http/1.1``, ``gpt-4o``). A plain
word of letters (``paris``, ``pending``) or a short number (``42``) is never matched. A value matches
where it appears verbatim (case sensitive) between characters that are not letters or digits.

Data edges are computed at score time, not at build time: whether a step failed is known only once it
is scored (an error payload in a tool result fails a tool whose span passed), and the earlier turns
were built by earlier builds. They are written with the failed step's ``build_id`` (a rebuild of the
trace is scored again, and gets its own); an edge already stored for that build is not written again.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tracedag.pipeline.score.scan import recent_files, recent_spans
from tracedag.pipeline.store.fetch import arrow
from tracedag.pipeline.store.parquet import write_parquet_atomic
from tracedag.pipeline.store.views import connect, refresh_views
from tracedag.schemas.fsio import file_lock
from tracedag.schemas.layout import BUILD_LOCK, state_file, table_dir
from tracedag.schemas.tables import DAG_EDGES_V1

logger = logging.getLogger(__name__)

FAIL_THRESHOLD = 2.0
"""A tool step whose lowest score is at most this failed (root_causes' default ``fail_threshold``)."""
MAX_VALUE = 512
ROW_GROUP = 16 * 1024
"""Rows per row group of a data-edges file, sorted by trace id as the build's files are (one trace is found by
its row groups' statistics)."""

STOP_WORDS = frozenset({
    "utf-8", "utf8", "utf-16", "ascii", "base64", "sha256", "sha1", "md5", "iso8601", "iso-8601", "x86_64",
    "http/1.1", "http/2", "http2", "oauth2", "ipv4", "ipv6", "mp3", "mp4", "h264", "gpt-4", "gpt-4o",
    "gpt-4o-mini", "gpt-3.5-turbo", "application/json", "text/plain", "text/html", "true", "false", "null",
    "none", "undefined", "default", "unknown",
})
"""Tokens that pass the shape rules but name a format, protocol or model, not a value of the run."""

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://\S+$")
_NUMBER = re.compile(r"^[+-]?\d+(?:\.\d+)?$")
_IDENT = re.compile(r"^[A-Za-z0-9]+(?:[_\-.:@/#][A-Za-z0-9]+)+$")
_CAMEL = re.compile(r"^[a-z]+[A-Z][A-Za-z0-9]*$|^[A-Z][a-z0-9]+[A-Z][A-Za-z0-9]*$")


def matchable(value: str) -> bool:
    """Whether an argument value is specific enough to trace to where it came from (module docstring)."""
    v = value.strip()
    if not v or len(v) > MAX_VALUE or any(c.isspace() for c in v) or v.lower() in STOP_WORDS:
        return False
    if _URL.match(v):
        return True
    if _NUMBER.match(v):
        return sum(c.isdigit() for c in v) >= 3
    if len(v) >= 4 and any(c.isdigit() for c in v) and any(c.isalnum() for c in v):
        return True
    return len(v) >= 6 and bool(_IDENT.match(v) or _CAMEL.match(v))


def argument_values(input_text: str | None) -> list[tuple[str, str]]:
    """(argument, value) of every matchable leaf of a step's input (JSON path without ``$.``)."""
    if not input_text:
        return []
    try:
        parsed: Any = json.loads(input_text)
    except ValueError:
        return [("input", input_text.strip())] if matchable(input_text) else []
    out: list[tuple[str, str]] = []
    _leaves(parsed, "", out)
    return [(k, v) for k, v in out if matchable(v)]


def _leaves(node: Any, path: str, out: list[tuple[str, str]]) -> None:
    if isinstance(node, dict):
        for k, v in node.items():
            _leaves(v, f"{path}.{k}" if path else str(k), out)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _leaves(v, f"{path}[{i}]", out)
    elif isinstance(node, bool) or node is None:
        return
    elif isinstance(node, (int, float, str)):
        out.append((path or "input", str(node).strip()))


def appears(value: str, text: str) -> bool:
    """``value`` verbatim in ``text``, not inside a longer run of letters or digits."""
    return re.search(r"(?<![A-Za-z0-9])" + re.escape(value) + r"(?![A-Za-z0-9])", text) is not None


# Read from the raw views with the latest build of each trace in scope picked first (the refined
# views pick the latest build of every trace in the store before any filter applies). ``$from_build``: no
# trace in scope has a latest build older (build ids sort by build time), ``$received_from``: no span of
# theirs arrived earlier; the files' row groups of older builds and arrivals are skipped on their statistics.
# ``__spans__``, ``__traces__``, ``__nodes__``, ``__edges__``: the raw relations of spans, traces, dag_nodes and
# dag_edges (``scan.recent_files``: the files holding any row from that arrival, of those builds).
_CONSUMERS_SQL = f"""
with latest as materialized (
    select trace_id, arg_max(build_id, (built_unix_nano, build_id)) as build_id,
           arg_max(coalesce(conversation_id, trace_id), (built_unix_nano, build_id)) as conv,
           arg_max(start_time_unix_nano, (built_unix_nano, build_id)) as trace_start
    from __traces__ where trace_id in (select trace_id from __prov_scope) and build_id >= $from_build
    group by trace_id
),
failed as (
    select s.trace_id, s.span_id from step_scores_all s
    where s.trace_id in (select trace_id from latest) and s.score is not null
      and (s.build_id >= $from_build or s.build_id is null)
      and (s.build_id is null or exists (select 1 from latest l where l.trace_id = s.trace_id and l.build_id = s.build_id))
    group by all having min(cast(s.score as double)) <= {FAIL_THRESHOLD}
),
tools as materialized (
    select n.trace_id, n.span_id, n.build_id, n.start_time_unix_nano from __nodes__ n
    semi join latest l on l.trace_id = n.trace_id and l.build_id = n.build_id
    semi join failed f on f.trace_id = n.trace_id and f.span_id = n.span_id
    where n.trace_id in (select trace_id from failed) and n.build_id >= $from_build
      and cast(n.step_type as varchar) = 'tool'
),
inputs as (
    select s.trace_id, s.span_id, any_value(s.input_text) as input_text from __spans__ s
    semi join tools k on k.trace_id = s.trace_id and k.span_id = s.span_id
    where s.trace_id in (select trace_id from tools) and s.received_unix_nano >= $received_from
    group by all
),
emitters as (
    select e.trace_id, e.downstream_span_id as span_id, list(e.upstream_span_id) as emitters from __edges__ e
    semi join tools k on k.trace_id = e.trace_id and k.span_id = e.downstream_span_id and k.build_id = e.build_id
    where e.trace_id in (select trace_id from tools) and e.build_id >= $from_build and e.edge_kind = 'tool_call'
    group by all
)
select k.trace_id, k.span_id, k.build_id, k.start_time_unix_nano as start_ns, l.conv, l.trace_start,
       i.input_text, m.emitters
from tools k
join latest l on l.trace_id = k.trace_id
left join inputs i on i.trace_id = k.trace_id and i.span_id = k.span_id
left join emitters m on m.trace_id = k.trace_id and m.span_id = k.span_id
order by k.trace_id, k.start_time_unix_nano, k.span_id
"""

# Every step of the consumers' conversations that could have written a value: its output, and each
# trace's user message (the earliest model call's input, else the root span's: replay.source's rule).
# spans_all, not spans: the conversation comes from traces, and the spans view's window over every
# trace would be computed before the filter.
_SOURCES_SQL = """
with conv_traces as (
    select trace_id, coalesce(conversation_id, trace_id) as conv, start_time_unix_nano as trace_start from traces
    where coalesce(conversation_id, trace_id) in (select conv from __prov_convs)
),
s as (
    select s.trace_id, s.span_id, s.parent_span_id, cast(s.step_type as varchar) as step_type, s.input_text,
           s.output_text, s.start_time_unix_nano, s.end_time_unix_nano, c.conv, c.trace_start
    from spans_all s join conv_traces c using (trace_id)
),
users as (
    select trace_id, coalesce(
               arg_min(span_id, (start_time_unix_nano, span_id)) filter (where step_type = 'llm' and input_text is not null),
               arg_min(span_id, (start_time_unix_nano, span_id)) filter (where parent_span_id is null)) as span_id
    from s group by trace_id
)
select s.conv, s.trace_id, s.trace_start, s.span_id, 'output' as data_from, s.output_text as text,
       s.end_time_unix_nano as at_ns
from s where s.output_text is not null
union all
select s.conv, s.trace_id, s.trace_start, s.span_id, 'user', s.input_text, s.start_time_unix_nano
from s semi join users u on u.trace_id = s.trace_id and u.span_id = s.span_id
where s.input_text is not null
"""


@dataclass(frozen=True)
class Source:
    """A place a value may come from: a step's output or a turn's user message."""

    trace_id: str
    trace_start: int
    span_id: str
    data_from: str
    text: str
    at_ns: int


def data_edges(con: duckdb.DuckDBPyConnection, trace_ids: pa.Table, received_from: int = 0,
               from_build: str = "") -> pa.Table:
    """The ``data`` edges into the failed tool steps of ``trace_ids`` (a one-column table), on ``con``'s views.

    ``received_from``: no span of these traces arrived earlier (0: unknown); ``from_build``: none of them has a
    build older than this one (``""``: unknown). The failed steps and their inputs are read from the files' row
    groups of those builds and arrivals (the others are skipped on their statistics).
    """
    with _registered(con, "__prov_scope", trace_ids):
        # only a step with a value worth tracing needs its conversation's texts read
        bounds = {"received_from": received_from, "from_build": from_build}
        sql = _consumers_sql(con, received_from, from_build)
        consumers = [c for c in arrow(con, sql, bounds).to_pylist() if argument_values(c["input_text"])]
    rows: list[dict[str, Any]] = []
    if consumers:
        convs = pa.table({"conv": pa.array(sorted({c["conv"] for c in consumers}), pa.string())})
        sources: dict[str, list[Source]] = {}
        with _registered(con, "__prov_convs", convs):
            for r in arrow(con, _SOURCES_SQL).to_pylist():
                sources.setdefault(r["conv"], []).append(Source(r["trace_id"], r["trace_start"] or 0, r["span_id"],
                                                                r["data_from"], r["text"], r["at_ns"] or 0))
        for c in consumers:
            rows += _edges_of(c, sorted(sources.get(c["conv"], []), key=lambda s: (s.trace_start, s.trace_id, s.at_ns,
                                                                                 s.data_from != "user", s.span_id)))
    return pa.Table.from_pylist(rows, schema=DAG_EDGES_V1)


@contextmanager
def _registered(con: duckdb.DuckDBPyConnection, name: str, table: pa.Table) -> Iterator[None]:
    """``table`` queryable as ``name`` on ``con`` meanwhile (a connection kept for the next round keeps nothing)."""
    con.register(name, table)
    try:
        yield
    finally:
        con.unregister(name)


def _consumers_sql(con: duckdb.DuckDBPyConnection, received_from: int, from_build: str) -> str:
    """``_CONSUMERS_SQL`` over the files holding rows since ``received_from`` and ``from_build`` (``data_edges``)."""
    sql = _CONSUMERS_SQL.replace("__spans__", recent_spans(con, received_from))
    for name, table in (("__traces__", "traces"), ("__nodes__", "dag_nodes"), ("__edges__", "dag_edges")):
        sql = sql.replace(name, recent_files(con, table, "build_id", from_build) if from_build else f"{table}_all")
    return sql


def _edges_of(c: dict[str, Any], sources: list[Source]) -> list[dict[str, Any]]:
    """One edge per matchable argument of consumer ``c``: from the earliest source holding its value."""
    out: list[dict[str, Any]] = []
    skip = {c["span_id"], *(c["emitters"] or [])}  # its own and the emitting model call's outputs
    before = [s for s in sources if (s.data_from == "user" or s.span_id not in skip) and _earlier(s, c)]
    for arg, value in dict.fromkeys(argument_values(c["input_text"])):
        src = next((s for s in before if appears(value, s.text)), None)
        if src is None:
            continue
        out.append({"trace_id": c["trace_id"], "build_id": c["build_id"], "src_span_id": src.span_id,
                    "dst_span_id": c["span_id"], "edge_kind": "data", "upstream_span_id": src.span_id,
                    "downstream_span_id": c["span_id"], "src_trace_id": src.trace_id, "data_arg": arg,
                    "data_from": src.data_from})
    return out


def _earlier(s: Source, c: dict[str, Any]) -> bool:
    """``s`` was there before consumer ``c`` started: an earlier turn, or done (a user message: begun) before it."""
    if s.trace_id != c["trace_id"]:
        return (s.trace_start, s.trace_id) < (c["trace_start"] or 0, c["trace_id"])
    return s.at_ns <= (c["start_ns"] or 0)


_STORED_SQL = """
select e.trace_id, e.build_id, e.src_span_id, e.dst_span_id, e.data_arg from dag_edges e
where e.edge_kind = 'data' and e.trace_id in (select trace_id from __prov_scope)
"""


def write_data_edges(data: Path, con: duckdb.DuckDBPyConnection, trace_ids: pa.Table, received_from: int = 0,
                     from_build: str = "") -> int:
    """Compute and store the data edges of ``trace_ids`` not stored yet for their build; return how many
    (``received_from``, ``from_build``: as ``data_edges``)."""
    edges = data_edges(con, trace_ids, received_from, from_build)
    if edges.num_rows == 0:
        return 0
    with _registered(con, "__prov_scope", trace_ids):
        stored = {tuple(r.values()) for r in arrow(con, _STORED_SQL).to_pylist()}
    keep = [r for r in edges.to_pylist()
            if (r["trace_id"], r["build_id"], r["src_span_id"], r["dst_span_id"], r["data_arg"]) not in stored]
    if not keep:
        return 0
    table = pa.Table.from_pylist(sorted(keep, key=lambda r: (r["trace_id"], r["dst_span_id"], r["data_arg"])),
                                 schema=DAG_EDGES_V1)
    # the build lock: a build's collection swaps the dag_edges directory, which must not lose this file
    with file_lock(state_file(data, BUILD_LOCK)):
        write_parquet_atomic(table, table_dir(data, "dag_edges"), row_group_size=ROW_GROUP)
    logger.info("stored %d data edges", table.num_rows)
    return int(table.num_rows)


def _failed_traces(scored_files: list[Path], build_id: str | None = None) -> tuple[pa.Table, bool]:
    """The trace ids with a failing row in ``scored_files`` (a round without one costs no query), and whether
    every one of them has a row of build ``build_id`` there (was built by it; False without ``build_id``)."""
    failing, built = [], []
    for f in scored_files:
        if f.exists():
            t = pq.read_table(f, columns=["trace_id", "build_id", "score"])
            failing.append(t.filter(pc.less_equal(t.column("score"), FAIL_THRESHOLD)).column("trace_id"))
            if build_id is not None:
                built.append(t.filter(pc.equal(t.column("build_id"), build_id)).column("trace_id"))
    scope = pa.table({"trace_id": _ids(failing)}).group_by("trace_id").aggregate([])
    return scope, build_id is not None and bool(pc.all(pc.is_in(scope.column("trace_id"), value_set=_ids(built)
                                                                .combine_chunks())).as_py())


def _ids(columns: list[pa.ChunkedArray]) -> pa.ChunkedArray:
    return pa.chunked_array([c for col in columns for c in col.chunks], pa.string())


def provenance_round(data: Path, scored_files: list[Path], con: duckdb.DuckDBPyConnection | None = None,
                     built: tuple[str, int] | None = None) -> int:
    """Store the data edges of the traces with a failing row in ``scored_files`` (a score run's); return how many.
    ``con``: a ``views.connect`` connection to read on (its views brought to the store as it is,
    ``views.refresh_views``) instead of one of its own. ``built``: (build id, earliest arrival) of a live round's
    build: no span of a trace it built arrived before (``LiveRound``), and its latest build is that one or newer;
    when it built every trace in scope, their failed steps are read from those builds and arrivals."""
    scope, in_build = _failed_traces(scored_files, built[0] if built is not None else None)
    if scope.num_rows == 0:
        return 0
    received_from, from_build = (built[1], built[0]) if built is not None and in_build else (0, "")
    if con is not None:
        refresh_views(con, data)
        return write_data_edges(data, con, scope, received_from, from_build)
    con = connect(data, shared_macros=False)  # the data edges' SQL calls none of the shared macros
    try:
        con.execute("set enable_progress_bar = false")
        return write_data_edges(data, con, scope, received_from, from_build)
    finally:
        con.close()
