"""Run selections, one syntax for every command that picks runs (``regress``, ``validate``):
``key=value[,key=value]`` over run labels, or ``sql:<condition>``.

A key is a column of ``traces`` (``service_version``, ``run_id``, ``scenario_id``, ``replay_index``,
``variant_id``, ...), else a column of the trace's root span in ``spans`` (``agent_name``, ``model``),
else the root span's attribute ``tracedag.<key>`` or ``<key>`` (span, then resource), so
``simulation_id=sim-base`` works. A ``*`` in a value matches any text (``run_id=nightly-42/*``).
``sql:`` takes a condition over ``traces`` (alias ``t``) and its root span (alias ``r``).
Values are quoted as SQL literals; keys must be plain names.
"""

from __future__ import annotations

import re

import pyarrow as pa

from tracedag.schemas.errors import TracedagError
from tracedag.schemas.spans import SPANS_V1
from tracedag.schemas.tables import TRACES_V1

KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")
_TRACE_COLUMNS = set(TRACES_V1.names)
_SPAN_COLUMNS = {f.name for f in SPANS_V1 if not pa.types.is_nested(f.type)}

FROM_SQL = "traces t left join spans r on r.trace_id = t.trace_id and r.span_id = t.root_span_id"
"""What a selection's condition is evaluated over."""

SYNTAX = ("expected key=value[,key=value] (run labels such as scenario_id=p02, service_version=1.2.0, "
          "run_id=..., variant_id=...) or sql:<condition over traces t and the root span r>")


class SelectionSyntax(TracedagError):  # type: ignore[misc,unused-ignore]
    """A selection that cannot be parsed; ``reason`` says why (the caller names the option)."""

    def __init__(self, text: str, reason: str) -> None:
        super().__init__(f"{text!r}: {reason}")
        self.text = text
        self.reason = reason


def literal(value: str) -> str:
    """``value`` as a SQL string literal."""
    return "'" + value.replace("'", "''") + "'"


def label_column(key: str) -> str:
    """The SQL expression (over ``FROM_SQL``) of the run label ``key``, as text."""
    if key in _TRACE_COLUMNS:
        return f"cast(t.{key} as varchar)"
    if key in _SPAN_COLUMNS:
        return f"cast(r.{key} as varchar)"
    names = (literal(f"tracedag.{key}"), literal(key))
    return "coalesce(" + ", ".join(f"r.{m}[{n}]" for m in ("attributes", "resource_attributes") for n in names) + ")"


def _match(key: str, value: str) -> str:
    column = label_column(key)
    if "*" in value:
        pattern = value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_").replace("*", "%")
        return f"{column} like {literal(pattern)} escape '\\'"
    return f"{column} = {literal(value)}"


def selection_condition(text: str) -> str:
    """The SQL condition over ``FROM_SQL`` that the selection ``text`` stands for (AND of its pairs)."""
    stripped = text.strip()
    if stripped.lower().startswith("sql:"):
        where = stripped[4:].strip()
        if not where:
            raise SelectionSyntax(text, "sql: needs a condition over traces (t) and the root span (r)")
        return f"({where})"
    parts: list[str] = []
    for pair in stripped.split(","):
        key, sep, value = (x.strip() for x in pair.partition("="))
        if not sep or not KEY.match(key) or not value:
            raise SelectionSyntax(text, SYNTAX)
        parts.append(_match(key, value))
    return " and ".join(parts)
