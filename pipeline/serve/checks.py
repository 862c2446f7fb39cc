"""The counterfactual check of a trace's root cause (``tracedag confirm``) in the trace view's document.

``root_cause_check`` of ``GET /api/traces/{trace_id}/view``: the latest ``root_cause_checks`` row of
the trace's root step (trace and span), else of its cross-turn root cause, else null. The latest
check of every checked root is read once per build state (a confirm writes a file: a new state).
"""

from __future__ import annotations

from typing import Any

from tracedag.pipeline.serve.data import Store, rerun_if_vanished

LATEST_SQL = """
select * from root_cause_checks
qualify row_number() over (partition by root_trace_id, root_span_id order by checked_unix_nano desc) = 1
"""

Root = tuple[str, str]


def root_cause_check(store: Store, trace_id: str, root_cause: dict[str, Any] | None,
                     cross_turn: dict[str, Any] | None, state: str | None = None) -> dict[str, Any] | None:
    """The latest check of the trace's root cause, else of its conversation's root cause across turns."""
    checks = latest_checks(store, state)
    if not checks:
        return None
    if root_cause is not None and root_cause.get("root_span_id"):
        found = checks.get((trace_id, str(root_cause["root_span_id"])))
        if found is not None:
            return found
    if cross_turn is not None and cross_turn.get("root_span_id"):
        root_trace = str(cross_turn.get("root_trace_id") or trace_id)
        return checks.get((root_trace, str(cross_turn["root_span_id"])))
    return None


def latest_checks(store: Store, state: str | None = None) -> dict[Root, dict[str, Any]]:
    """(root trace, root span) -> its latest check (cached per build state)."""
    state = state or store.state()
    found: dict[Root, dict[str, Any]] = store.cache.get(state, "root_cause_checks", lambda: _read(store, state))
    return found


def _read(store: Store, state: str) -> dict[Root, dict[str, Any]]:
    def read() -> dict[Root, dict[str, Any]]:
        cur = store._cursor(state)  # the state's connection: its views see the checks of this state
        try:
            rows = cur.sql(LATEST_SQL).to_arrow_table().to_pylist()
        finally:
            cur.close()
        return {(str(r["root_trace_id"]), str(r["root_span_id"])): r for r in rows}
    found: dict[Root, dict[str, Any]] = rerun_if_vanished(read)
    return found
