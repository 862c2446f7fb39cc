"""``tracedag show``: the DAG of one trace as an indented timeline for the terminal."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from tracedag import queries
from tracedag.pipeline.dag import dataflow, show_check, show_stored
from tracedag.pipeline.store import materialized
from tracedag.pipeline.store.fetch import arrow
from tracedag.pipeline.store.files import VANISHED_ATTEMPTS, file_vanished, parquet_files, vanished_pause
from tracedag.pipeline.store.shared_macros import create_shared_macros
from tracedag.pipeline.store.views import connect, create_views, latest_by_id, restrict_to_trace
from tracedag.schemas.errors import TracedagError

logger = logging.getLogger(__name__)

BAR_WIDTH = 24

_NODES_SQL = """
select n.*, s.score, s.metric_count
from dag_nodes n
left join (
    -- a step's score as in failures.sql: the minimum over its rows, the human rows only when labelled
    select span_id, coalesce(min(score) filter (where source = 'human'), min(score))::double as score,
           count(*) as metric_count
    from step_scores where trace_id = $t group by span_id
) s using (span_id)
where n.trace_id = $t
order by n.nested_left
"""


_SPANS_SQL = "select count(*) from spans_all where trace_id like $p || '%'"

SHOWN_TABLES = tuple(dict.fromkeys(("dag_nodes", "dag_edges", "step_scores", "spans", *materialized.reader_tables("propagation"),
                                    *materialized.reader_tables("root_causes"))))
"""The tables whose raw views ``load_shown`` makes (``views.create_raw_views``): the refined views it reads are
restricted to the trace (``restrict_to_trace``), the cause comes from ``propagation``'s stored rows and a silent
producer from ``root_causes``' (``show_stored``); every view is made only when the cause is computed from the SQL."""


class TraceNotFound(TracedagError):  # type: ignore[misc,unused-ignore]
    """No built trace matches the id (or the prefix matches several)."""

    def __init__(self, trace_id: str, reason: str) -> None:
        super().__init__(f"trace {trace_id} {reason}")
        self.trace_id = trace_id


def _missing(con: duckdb.DuckDBPyConnection, data: Path, trace_id: str) -> TraceNotFound:
    """Why no built trace matches: its spans are in the store but not built yet, or it is not in the store."""
    try:
        spans = con.execute(_SPANS_SQL, {"p": trace_id.lower()}).fetchone()
    except duckdb.CatalogException:  # a store without a spans file has no spans view
        spans = None
    if spans and spans[0]:
        count = f"{spans[0]} span" + ("" if spans[0] == 1 else "s")
        return TraceNotFound(trace_id, f"has {count} in the store {data} but is not built yet: run "
                                       f"`tracedag build --data {data} --idle 0` to build it now (a live trace is "
                                       "built once no span arrived for it for the idle time, 30 s by default)")
    return TraceNotFound(trace_id, f"is not in the store {data}")


@dataclass(frozen=True)
class Cause:
    """The trace's failure, its root cause (greedy, as ``root_causes``) and the failing steps between."""

    root_span_id: str
    failed_span_id: str
    path: tuple[str, ...]  # span ids from the root cause to the failure, both included
    hops_from_root: int
    longest_chain: int
    data: tuple[dataflow.DataEdge, ...] = ()  # value provenance: data edges into the trace's steps
    silent: dataflow.Silent | None = None  # the root is a step that passed but wrote the value that failed


@dataclass(frozen=True)
class Shown:
    """What ``tracedag show`` prints: the latest ``traces`` row, the nodes (pre-order, with score), the cause."""

    trace: dict[str, Any]
    nodes: list[dict[str, Any]]
    cause: Cause | None
    check: dict[str, Any] | None = None  # the latest counterfactual check of the cause (``show_check``)


# The failure DAG of one trace through the macro root_causes reads (root_causes per=trace greedy =
# the greedy root and hops of the row marked final; longest_chain as in propagation).
_CAUSE_SQL = """
select node, score, nearest, greedy_root_id, greedy_hops, final,
       coalesce(list_max(list_transform(ancestors, lambda x: x.dist)), 0) as longest_chain
from failure_dag_roots($fail_threshold, [$t]::varchar[], $max_hops, false)
order by node
"""


def load_shown(data: Path, trace_id: str, *, cause: bool = True) -> Shown:
    """The trace matching ``trace_id`` (id or unique prefix), its nodes and, when asked, its root cause
    and propagation path, read on one connection.

    Only the trace's own row groups are read: its latest build comes from ``traces_all`` by id, then
    the views are restricted to that trace and build (``views.restrict_to_trace``) and the same SQL
    runs over them. A garbage collection or a new build between two reads makes it read again.
    """
    for attempt in range(1, VANISHED_ATTEMPTS + 1):
        con = connect(data, tables=SHOWN_TABLES, private=True)  # each attempt lists the files again; a global setting
        try:
            # its few reads open the same files: their footers parsed once (a published file never changes)
            con.execute("set enable_progress_bar = false; set parquet_metadata_cache = true")
            return _read_shown(con, data, trace_id, cause)
        except (duckdb.IOException, _Superseded) as e:
            if attempt == VANISHED_ATTEMPTS or (isinstance(e, duckdb.IOException) and not file_vanished(e)):
                raise
            logger.info("trace %s: read again (%s)", trace_id, e)
            vanished_pause(attempt)
        finally:
            con.close()
    raise AssertionError("unreachable")


class _Superseded(Exception):
    """The trace's latest build changed while it was read (a build, then its garbage collection)."""


def _found(con: duckdb.DuckDBPyConnection, data: Path, trace_id: str) -> dict[str, Any]:
    """The latest ``traces`` row of the one trace ``trace_id`` names (id or unique prefix)."""
    found = latest_by_id(con, trace_id.lower())
    if not found:
        raise _missing(con, data, trace_id)
    if len(found) > 1 and found[0]["trace_id"] != trace_id:
        raise TraceNotFound(trace_id, "matches several traces: give more of the id")
    trace: dict[str, Any] = found[0]
    return trace


def _needs_macros(con: duckdb.DuckDBPyConnection, trace_id: str) -> bool:
    """Whether the cause is computed by the shared macros: the store has no current stored rows, or the trace
    has data edges (``dataflow.attach`` asks ``root_causes`` for a silent producer) and ``root_causes``' stored
    rows do not answer for it (computed over one trace, that query cost ~0.35 s CPU, most of it planning)."""
    if not show_stored.answers(con):
        return True
    if not con.sql("select 1 from dag_edges where trace_id = $t and edge_kind = 'data' limit 1",
                   params={"t": trace_id}).fetchall():
        return False
    return show_stored.silent_statement(con, trace_id) is None


def _read_shown(con: duckdb.DuckDBPyConnection, data: Path, trace_id: str, cause: bool) -> Shown:
    listed = parquet_files(data, "traces")
    trace = _found(con, data, trace_id)
    tid, build = str(trace["trace_id"]), str(trace["build_id"])
    restrict_to_trace(con, tid, build)
    nodes = arrow(con, _NODES_SQL, {"t": tid}).to_pylist()
    if cause and _needs_macros(con, tid):  # the SQL reads tables beyond the trace's: every view, then the macros
        create_views(con, data, shared_macros=False)
        restrict_to_trace(con, tid, build)
        create_shared_macros(con)
    found = _cause(con, tid) if cause else None
    check = show_check.read_check(con, data, tid, found.root_span_id) if found else None
    # A build of this trace after the first read, then a collection of the superseded build, may have
    # removed rows read above: the build still being the latest afterwards means nothing was removed. A build
    # or a collection writes a traces file: while their listing is the same, no build came.
    if parquet_files(data, "traces") != listed and [r["build_id"] for r in latest_by_id(con, tid, 1)] != [build]:
        raise _Superseded(f"build {build} was superseded")
    return Shown(trace, nodes, found, check)


def load_trace(data: Path, trace_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Return the latest ``traces`` row and the ``dag_nodes`` rows (pre-order, with score) of a trace."""
    shown = load_shown(data, trace_id, cause=False)
    return shown.trace, shown.nodes


def _cause(con: duckdb.DuckDBPyConnection, trace_id: str) -> Cause | None:
    """The root cause of a built trace and its propagation path (None when the trace did not fail)."""
    defaults = {p.name: p.default for p in queries.describe("root_causes").params}
    params = {"t": trace_id, "fail_threshold": float(defaults["fail_threshold"]),
              "max_hops": int(defaults["max_hops"])}
    rows = show_stored.cause_rows(con, trace_id)  # the rows stored at score time, else computed
    if rows is None:
        rows = arrow(con, _CAUSE_SQL, params).to_pylist()  # planned once
    final = next((r for r in rows if r["final"]), None)
    if final is None:
        return None
    steps = {r["node"]: r for r in rows}
    path = _walk(final["node"], final["greedy_root_id"], steps)
    found: Cause = dataflow.attach(con, trace_id, Cause(final["greedy_root_id"], final["node"], tuple(path),
                                                        int(final["greedy_hops"]), int(final["longest_chain"])))
    return found


def _walk(failed: str, root: str, steps: dict[str, dict[str, Any]]) -> list[str]:
    """The greedy walk back from ``failed``, root first: each move goes to a failing upstream step
    (``nearest``) with the same greedy root one hop nearer to it (the lowest score when several do)."""
    path = [failed]
    while path[-1] != root and len(path) <= len(steps):
        here = steps[path[-1]]
        nearer = [u for u in here["nearest"] or [] if u in steps and steps[u]["greedy_root_id"] == root
                  and steps[u]["greedy_hops"] == here["greedy_hops"] - 1]
        if not nearer:
            break
        path.append(min(nearer, key=lambda u: (steps[u]["score"], u)))
    if path[-1] != root:
        path.append(root)
    return path[::-1]


def _ms(ns: int | None) -> str:
    if ns is None:
        return ""
    if ns < 1_000_000_000:
        return f"{ns / 1e6:.1f}ms"
    return f"{ns / 1e9:.2f}s"


def _bar(node: dict[str, Any], t0: int, total: int) -> Text:
    a = int((node["start_time_unix_nano"] - t0) / total * BAR_WIDTH)
    b = max(a + 1, int((node["end_time_unix_nano"] - t0) / total * BAR_WIDTH))
    style = "red" if node["status_code"] == 2 else ("yellow" if node["branch_id"] else "cyan")
    return Text("·" * a) + Text("█" * (min(b, BAR_WIDTH) - a), style=style) + Text("·" * max(0, BAR_WIDTH - b))


def _status(code: int | None) -> Text:
    return {2: Text("ERROR", style="bold red"), 1: Text("ok", style="green")}.get(code or 0, Text("-", style="dim"))


def _flags(node: dict[str, Any]) -> str:
    marks = [("retry", node["is_retry"]), ("orphan", node["is_orphan"]), ("skew", node["clock_skew"])]
    return " ".join(m for m, on in marks if on)


def _header(trace: dict[str, Any]) -> Text:
    t = Text()
    t.append(f"trace {trace['trace_id']}", style="bold")
    t.append(f"  {trace['method']}", style="magenta")
    t.append(f"  {trace['span_count']} spans · {trace['error_count']} errors · {trace['root_count']} roots")
    t.append(f" · {trace['orphan_count']} orphans · {trace['clock_skew_count']} skewed · {_ms(trace['duration_ns'])}")
    for label, key in (("fallback", "fallback_reason"), ("deviant", "deviation_reason")):
        if trace.get(key):
            t.append(f"\n{label}: {trace[key]}", style="yellow")
    return t


def _mark(span_id: str, cause: Cause | None) -> Text:
    """The cause column: the root cause, the failing steps it propagated through, the trace's failure."""
    if cause is None or span_id not in cause.path:
        return _data_mark(span_id, cause)
    return _path_mark(span_id, cause) + _data_mark(span_id, cause, " ")


def _path_mark(span_id: str, cause: Cause) -> Text:
    if cause.silent is not None and span_id == cause.root_span_id:
        return Text("◆ root cause: " + ("the user's message" if cause.silent.user else "silent producer"),
                    style="bold red")
    if span_id == cause.root_span_id:
        return Text("◆ root cause" + (" = failure" if span_id == cause.failed_span_id else ""), style="bold red")
    if span_id == cause.failed_span_id:
        return Text(f"✖ failure ({cause.path.index(span_id)})", style="bold red")
    return Text(f"↓ path ({cause.path.index(span_id)})", style="red")


def _data_mark(span_id: str, cause: Cause | None, sep: str = "") -> Text:
    """A step a data edge enters: the arguments whose values came from an earlier step or the user."""
    args = [e.data_arg for e in (cause.data if cause else ()) if e.dst_span_id == span_id]
    return Text(sep + "← data " + ", ".join(args), style="magenta") if args else Text("")


def _silent_line(cause: Cause, name: Any) -> Text:
    """Why a step that passed is the root cause: the value it wrote is the one the failure rejected."""
    s = cause.silent
    assert s is not None
    who = "the user typed" if s.user else f"{name(s.producer_span_id)} wrote"
    return Text(f"\nsilent producer: {who} the value of {s.data_arg}, which {name(s.consumer_span_id)} failed on "
                "as unknown, invalid or not found (dag_edges edge_kind 'data')", style="magenta")


def _cause_line(cause: Cause, nodes: list[dict[str, Any]]) -> Text:
    """One line naming the root cause and the path to the failure, readable in a pipe without colour."""
    by_span = {n["span_id"]: n for n in nodes}

    def name(span_id: str) -> str:
        n = by_span.get(span_id)
        return (n["step_name"] or span_id) if n else span_id

    root = by_span.get(cause.root_span_id) or {}
    score = "" if root.get("score") is None else f", score {root['score']:.1f}"
    t = Text("root cause: ", style="bold")
    if cause.silent is not None and cause.silent.user:
        t.append(f"the user's message (carried by {name(cause.root_span_id)})", style="bold red")
    else:
        t.append(f"{name(cause.root_span_id)} ({root.get('step_type') or '?'}{score})", style="bold red")
    if len(cause.path) > 1:
        t.append(" → " + " → ".join(name(s) for s in cause.path[1:]) + " (the trace's failure)")
    hops = f"{cause.hops_from_root} hop" + ("" if cause.hops_from_root == 1 else "s")
    t.append(f"; {hops} from the root, longest failure chain {cause.longest_chain} (tracedag query root_causes)",
             style="dim")
    return t + _silent_line(cause, name) if cause.silent is not None else t


def render_trace(trace: dict[str, Any], nodes: list[dict[str, Any]], cause: Cause | None = None) -> RenderableType:
    """A rich renderable: trace header, one row per step in call-tree pre-order (the root cause and
    its propagation path marked), then the root-cause line."""
    t0 = trace["start_time_unix_nano"] or 0
    total = max(int(trace["duration_ns"] or 0), 1)
    table = Table(box=None, pad_edge=False, header_style="bold")
    columns = [("step", "left"), ("type", "left"), ("iter", "right"), ("branch", "right"), ("start", "right"),
               ("duration", "right"), ("status", "left"), ("score", "right"), ("cause", "left"), ("flags", "left"),
               ("timeline", "left")]
    for col, justify in columns if cause is not None else [c for c in columns if c[0] != "cause"]:
        table.add_column(col, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for n in nodes:
        name = n["step_name"] or n["span_id"]
        score = "" if n["score"] is None else f"{n['score']:.1f}"
        cells: list[RenderableType] = [
            Text("  " * n["depth"] + name, style="bold" if n["depth"] == 0 else ""), n["step_type"] or "",
            str(n["iteration"]), str(n["branch_id"]) if n["branch_id"] else "", _ms(n["start_time_unix_nano"] - t0),
            _ms(n["duration_ns"]), _status(n["status_code"]), score]
        if cause is not None:
            cells.append(_mark(n["span_id"], cause))
        table.add_row(*cells, _flags(n), _bar(n, t0, total))
    if cause is None:
        return Group(_header(trace), table)
    return Group(_header(trace), table, _cause_line(cause, nodes))
