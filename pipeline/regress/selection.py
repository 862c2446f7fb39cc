"""The two sides of a comparison: ``--baseline`` / ``--candidate`` selections
(``tracedag.pipeline.store.selection``: run labels ``key=value[,key=value]`` or ``sql:<condition>``)
read as traces with their labels.

A trace without a ``scenario_id`` is a scenario of its own conversation (``conversation_id``), the
scenario ``tracedag replay`` gives the replays of an unlabelled conversation: live traffic pairs
with its replays conversation by conversation.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from tracedag.pipeline.regress.model import RegressError
from tracedag.pipeline.store.querying import run_sql
from tracedag.pipeline.store.selection import (
    FROM_SQL,
    KEY,
    SelectionSyntax,
    label_column,
    selection_condition,
)
from tracedag.schemas.errors import QueryFailed

LABEL_COLUMNS = ("scenario_id", "replay_index", "variant_id", "service_name", "agent_name", "conversation_id")


@dataclass(frozen=True)
class Selection:
    """A parsed selector: the SQL condition it stands for."""

    text: str
    condition: str


def parse_selection(text: str, side: str) -> Selection:
    """Parse one ``--baseline`` / ``--candidate`` selector; ``RegressError`` when malformed."""
    try:
        return Selection(text, selection_condition(text))
    except SelectionSyntax as e:
        raise RegressError(f"--{side} {text!r}: {e.reason}") from e


def _sql(selection: Selection) -> str:
    return f"""
select t.trace_id, coalesce(t.scenario_id, t.conversation_id) as scenario_id, t.replay_index, t.variant_id, t.service_name, r.agent_name, t.conversation_id
from {FROM_SQL}
where {selection.condition}
order by t.start_time_unix_nano, t.trace_id
"""


def select_traces(data: Path, selection: Selection, side: str) -> pa.Table:
    """The selected traces with their labels (``LABEL_COLUMNS``); ``RegressError`` when none match."""
    try:
        table = run_sql(data, _sql(selection))
    except QueryFailed as e:
        raise RegressError(f"--{side} {selection.text!r}: {e.reason}") from e
    if table.num_rows == 0:
        raise RegressError(f"--{side} {selection.text!r} selects no built trace{_hint(data, selection)}")
    return table


def _hint(data: Path, selection: Selection) -> str:
    """The values the first key takes in the store, to spot a typo."""
    key = selection.text.partition("=")[0].strip()
    if selection.text.lower().startswith("sql:") or not KEY.match(key):
        return ""
    column = label_column(key)
    try:
        rows = run_sql(data, f"""select distinct {column} as v from {FROM_SQL}
            where {column} is not null order by 1 limit 11""").column("v").to_pylist()
    except QueryFailed:
        return ""
    if not rows:
        return f" (no trace has {key}; is the store built? `tracedag build`)"
    shown = ", ".join(str(v) for v in rows[:10]) + (", ..." if len(rows) > 10 else "")
    return f" ({key} in the store: {shown})"
