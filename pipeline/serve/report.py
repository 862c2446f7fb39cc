"""``tracedag report``: the web UI as one self-contained HTML file (scripts, style and data inlined).

The trace list holds every trace (``trace_summary`` with the agent name, optionally ``since``); the
full documents (spans, DAG, scores, failures, root cause, propagation path) of ``max_traces`` of
them are inlined: the failed traces first (most unrecovered failures first), then the other traces
with a root cause, then the newest. A listed row without its document is no link and says why. So
are the newest ``MAX_REGRESSIONS`` saved ``tracedag regress`` reports inlined, and the cross-turn
root causes of the conversations. The page needs no server and no network: mail it, or keep it as a
CI artifact.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracedag.pipeline.regress import saved
from tracedag.pipeline.serve import encode, tracelist
from tracedag.pipeline.serve.assets import SCRIPTS, vendor_text
from tracedag.pipeline.serve.checks import root_cause_check
from tracedag.pipeline.serve.data import Store
from tracedag.pipeline.serve.traces_api import with_path
from tracedag.pipeline.store.querying import run_named
from tracedag.schemas.errors import QueryFailed

STATIC = Path(__file__).parent / "static"
MAX_LIST = 5000
MAX_REGRESSIONS = 20
SCRIPTS_OWN = ("dag.js", "app.js")


@dataclass(frozen=True)
class ReportStats:
    traces: int
    detailed: int
    size_bytes: int


def _script(text: str) -> str:
    # "</script" inside inlined code or data would end the element early
    return "<script>" + text.replace("</script", "<\\/script").replace("<!--", "<\\!--") + "</script>"


def _pick(traces: list[dict[str, Any]], n: int) -> list[str]:
    """``n`` trace ids: failed first, then with a root cause (most unrecovered failures first), then newest."""
    ranked = sorted((t for t in traces if t["passed"] is False or t["root_cause_span_id"]),
                    key=lambda t: (t["passed"] is not False, -(t["unrecovered_failures"] or 0), t["trace_id"]))
    ids = [t["trace_id"] for t in ranked[:n]]
    taken = set(ids)
    ids += [t["trace_id"] for t in traces if t["trace_id"] not in taken][: n - len(ids)]
    return ids


def _conversation_causes(data: Path, traces: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """trace id -> its root cause across the turns of its conversation, for the listed traces."""
    listed = {t["trace_id"] for t in traces}
    return {r["trace_id"]: r for r in _rows_or_none(data, "root_causes", {"per": "conversation"})
            if r["trace_id"] in listed}


def _rows_or_none(data: Path, name: str, params: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """A named query's rows, or none when its inputs are missing (the analysis tables of ``tracedag determinism``)."""
    try:
        rows: list[dict[str, Any]] = run_named(data, name, params or {}).to_pylist()
    except QueryFailed:
        return []
    return rows


def _regressions(data: Path) -> list[dict[str, Any]]:
    """The newest ``MAX_REGRESSIONS`` saved regression reports: each its list row and its document."""
    return [{"summary": row, "doc": saved.read_report(data, row["name"])}
            for row in saved.list_reports(data)[:MAX_REGRESSIONS]]


def build_page(data: Path, max_traces: int = 50, since: str | None = None) -> tuple[str, int, int]:
    """The HTML text, the number of traces listed and of traces inlined in full."""
    store = Store(data)
    total, page = tracelist.page(store, tracelist.TraceQuery(since=since, limit=MAX_LIST))
    traces = page.to_pylist()
    docs = store.documents(_pick(traces, max_traces))
    names = {t["trace_id"]: t["agent"] for t in traces}
    details = {tid: with_path(doc, names.get(tid, "")) for tid, doc in docs.items()}
    extra: dict[str, Any] = {name: _rows_or_none(data, name) for name in ("determinism", "node_utility", "edge_utility")}
    extra["regressions"] = _regressions(data)
    extra["conversation_causes"] = _conversation_causes(data, traces)
    for tid, doc in details.items():  # the root cause's counterfactual check (tracedag confirm), as serve's view
        doc["root_cause_check"] = root_cause_check(store, tid, doc.get("root_cause"),
                                                   extra["conversation_causes"].get(tid))
    html = page_html({"traces": traces, "total": total, "details": details, **extra})
    return html, len(traces), len(details)


def page_html(data: dict[str, Any]) -> str:
    """The web UI's page with ``data`` as ``window.TRACEDAG_DATA`` and every script and style inlined."""
    payload = encode.dumps(data)
    html = (STATIC / "index.html").read_text()
    inline = _script("window.TRACEDAG_DATA = " + payload + ";")
    html = html.replace("<!--INLINE-DATA-->", inline)
    html = html.replace('<link rel="stylesheet" href="static/style.css">',
                        "<style>" + (STATIC / "style.css").read_text() + "</style>")
    for name in SCRIPTS:
        html = html.replace(f'<script src="static/vendor/{name}"></script>', _script(vendor_text(name)))
    for name in SCRIPTS_OWN:
        html = html.replace(f'<script src="static/{name}"></script>', _script((STATIC / name).read_text()))
    return html


def write_report(data: Path, out: Path, max_traces: int = 50, since: str | None = None) -> ReportStats:
    """Write the report to ``out`` (atomically) and say what it holds."""
    html, listed, detailed = build_page(data, max_traces, since)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(html)
    tmp.replace(out)
    return ReportStats(listed, detailed, out.stat().st_size)
