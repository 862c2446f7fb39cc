"""``tracedag report``: the web UI as one self-contained HTML file (scripts, style and data inlined).

The trace list holds every trace (``trace_summary``, optionally ``since``); the full documents
(spans, DAG, scores, failures, root cause) of ``max_traces`` of them are inlined: the traces with a
root cause first (most unrecovered failures first), then the newest; so are the newest
``MAX_REGRESSIONS`` saved ``tracedag regress`` reports. The page needs no server and
no network: mail it, or keep it as a CI artifact.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracedag.pipeline.regress import saved
from tracedag.pipeline.serve import encode
from tracedag.pipeline.serve.assets import SCRIPTS, vendor_text
from tracedag.pipeline.serve.data import Store
from tracedag.pipeline.store.querying import run_named
from tracedag.schemas.errors import QueryFailed

STATIC = Path(__file__).parent / "static"
MAX_LIST = 5000
MAX_REGRESSIONS = 20


@dataclass(frozen=True)
class ReportStats:
    traces: int
    detailed: int
    size_bytes: int


def _script(text: str) -> str:
    # "</script" inside inlined code or data would end the element early
    return "<script>" + text.replace("</script", "<\\/script").replace("<!--", "<\\!--") + "</script>"


def _pick(traces: list[dict[str, Any]], n: int) -> list[str]:
    rooted = sorted((t for t in traces if t["root_cause_span_id"]),
                    key=lambda t: (-(t["unrecovered_failures"] or 0), t["trace_id"]))
    ids = [t["trace_id"] for t in rooted[:n]]
    ids += [t["trace_id"] for t in traces if t["trace_id"] not in set(ids)][: n - len(ids)]
    return ids


def _rows_or_none(data: Path, name: str) -> list[dict[str, Any]]:
    """A named query's rows, or none when its inputs are missing (the analysis tables of ``tracedag determinism``)."""
    try:
        rows: list[dict[str, Any]] = run_named(data, name, {}).to_pylist()
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
    total, page = store.traces(since=since, limit=MAX_LIST)
    traces = page.to_pylist()
    details = store.documents(_pick(traces, max_traces))
    extra: dict[str, Any] = {name: _rows_or_none(data, name) for name in ("determinism", "node_utility", "edge_utility")}
    extra["regressions"] = _regressions(data)
    payload = encode.dumps({"traces": traces, "total": total, "details": details, **extra})
    html = (STATIC / "index.html").read_text()
    inline = _script("window.TRACEDAG_DATA = " + payload + ";")
    html = html.replace("<!--INLINE-DATA-->", inline)
    html = html.replace('<link rel="stylesheet" href="static/style.css">',
                        "<style>" + (STATIC / "style.css").read_text() + "</style>")
    for name in SCRIPTS:
        html = html.replace(f'<script src="static/vendor/{name}"></script>', _script(vendor_text(name)))
    html = html.replace('<script src="static/app.js"></script>', _script((STATIC / "app.js").read_text()))
    return html, len(traces), len(details)


def write_report(data: Path, out: Path, max_traces: int = 50, since: str | None = None) -> ReportStats:
    """Write the report to ``out`` (atomically) and say what it holds."""
    html, listed, detailed = build_page(data, max_traces, since)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(html)
    tmp.replace(out)
    return ReportStats(listed, detailed, out.stat().st_size)
