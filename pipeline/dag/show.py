"""``tracedag show``: the DAG of one trace as an indented timeline for the terminal."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from tracedag.pipeline.store.views import connect
from tracedag.schemas.errors import TracedagError

logger = logging.getLogger(__name__)

BAR_WIDTH = 24

_TRACE_SQL = "select * from traces where trace_id like $p || '%' order by trace_id limit 2"

_NODES_SQL = """
select n.*, s.score, s.metric_count
from dag_nodes n
left join (
    select span_id, min(score)::double as score, count(*) as metric_count
    from step_scores where trace_id = $t group by span_id
) s using (span_id)
where n.trace_id = $t
order by n.nested_left
"""


class TraceNotFound(TracedagError):  # type: ignore[misc,unused-ignore]
    """No built trace matches the id (or the prefix matches several)."""

    def __init__(self, trace_id: str, reason: str) -> None:
        super().__init__(f"trace {trace_id}: {reason}")
        self.trace_id = trace_id


def load_trace(data: Path, trace_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Return the latest ``traces`` row and the ``dag_nodes`` rows (pre-order, with score) of a trace."""
    con = connect(data)
    con.execute("set enable_progress_bar = false")
    try:
        found = con.sql(_TRACE_SQL, params={"p": trace_id.lower()}).to_arrow_table().to_pylist()
        if not found:
            raise TraceNotFound(trace_id, "not built (run `tracedag build`, or wait for the idle time)")
        if len(found) > 1 and found[0]["trace_id"] != trace_id:
            raise TraceNotFound(trace_id, "the prefix matches several traces")
        trace = found[0]
        nodes = con.sql(_NODES_SQL, params={"t": trace["trace_id"]}).to_arrow_table().to_pylist()
    finally:
        con.close()
    return trace, nodes


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


def render_trace(trace: dict[str, Any], nodes: list[dict[str, Any]]) -> RenderableType:
    """A rich renderable: trace header, then one row per step in call-tree pre-order."""
    t0 = trace["start_time_unix_nano"] or 0
    total = max(int(trace["duration_ns"] or 0), 1)
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col, justify in (("step", "left"), ("type", "left"), ("iter", "right"), ("branch", "right"),
                         ("start", "right"), ("duration", "right"), ("status", "left"), ("score", "right"),
                         ("flags", "left"), ("timeline", "left")):
        table.add_column(col, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for n in nodes:
        name = n["step_name"] or n["span_id"]
        score = "" if n["score"] is None else f"{n['score']:.1f}"
        table.add_row(
            Text("  " * n["depth"] + name, style="bold" if n["depth"] == 0 else ""),
            n["step_type"] or "",
            str(n["iteration"]),
            str(n["branch_id"]) if n["branch_id"] else "",
            _ms(n["start_time_unix_nano"] - t0),
            _ms(n["duration_ns"]),
            _status(n["status_code"]),
            score,
            _flags(n),
            _bar(n, t0, total),
        )
    return Group(_header(trace), table)
