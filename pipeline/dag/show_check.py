"""``tracedag show``'s line under the root cause: the latest counterfactual check of it (``tracedag confirm``).

The check shown is the latest ``root_cause_checks`` row of the shown root step (trace and span), else
the latest check of a root cause whose conversation's final failure is this trace (a cause found
across turns). A store without checks costs a directory listing, no query.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
from rich.text import Text

from tracedag.pipeline.store.files import parquet_files

TABLE = "root_cause_checks"

CHECK_SQL = f"""
select * from {TABLE}
where (root_trace_id = $t and root_span_id = $s) or trace_id = $t
order by (root_trace_id = $t and root_span_id = $s) desc, checked_unix_nano desc
limit 1
"""

_STYLE = {"confirmed": "bold green", "refuted": "bold yellow", "inconclusive": "dim"}


def read_check(con: duckdb.DuckDBPyConnection, data: Path, trace_id: str,
               root_span_id: str | None) -> dict[str, Any] | None:
    """The latest check of the trace's root cause (or of its conversation's), None when never checked; read on
    ``load_shown``'s connection, which has the view of ``root_cause_checks`` (a connection of its own cost ~60 ms
    CPU)."""
    if not parquet_files(data, TABLE):
        return None
    rows = con.sql(CHECK_SQL, params={"t": trace_id, "s": root_span_id or ""}).to_arrow_table().to_pylist()
    return rows[0] if rows else None


def check_line(check: dict[str, Any]) -> Text:
    """One line: verdict, replacement source, runs, downstream failure and score deltas."""
    verdict = str(check.get("verdict") or "inconclusive")
    t = Text("counterfactual check: ", style="bold")
    t.append(verdict, style=_STYLE.get(verdict, ""))
    t.append(f" ({check.get('root_step_name')}, {check.get('strategy')})")
    t.append("; replaced by " + replacement_text(check))
    t.append(f"; {check.get('runs') or 0} runs, the failure came back in {check.get('failures_after') or 0}")
    deltas = delta_text(check)
    if deltas:
        t.append("; " + deltas)
    t.append(" (tracedag confirm)", style="dim")
    return t


def replacement_text(check: dict[str, Any]) -> str:
    """``kind from source``, or ``nothing`` with the reason when no replacement was found."""
    kind = check.get("replacement_kind")
    if kind is None:
        return f"nothing: {check.get('reason') or 'no replacement'}"
    return f"{kind} from {check.get('replacement_source')}"


def delta_text(check: dict[str, Any]) -> str:
    """Downstream failures and step scores before -> after (what is known of them)."""
    parts = []
    before, after = check.get("downstream_failures_before"), check.get("downstream_failures_after")
    if before is not None and after is not None:
        parts.append(f"downstream failures {before} → {after:.1f}")
    s_before, s_after = check.get("downstream_score_before"), check.get("downstream_score_after")
    if s_before is not None and s_after is not None:
        parts.append(f"step scores {s_before:.2f} → {s_after:.2f} ({s_after - s_before:+.2f})")
    return ", ".join(parts)
