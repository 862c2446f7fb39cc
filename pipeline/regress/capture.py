"""``tracedag capture``: the state just before one step of a stored trace, as a test fixture (case.json).

The state is what the agent had when the step started: every LLM message and tool call of the
conversation's earlier turns (traces sharing ``conversation_id`` that started before this one) and
of this trace, from spans that ended before the step started, in start order; plus the step's own
inputs (its input messages, or its tool arguments) and, to compare against, what it produced in
the trace (output, status, error type). Messages are read from ``gen_ai.input.messages`` /
``gen_ai.output.messages`` (either message form), else ``input_text`` / ``output_text``; a message
already in the history is not repeated (chat APIs resend the whole history on every call).
``tracedag.testing.load_case`` reads the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tracedag.pipeline.regress.model import RegressError
from tracedag.pipeline.store.querying import run_sql

FORMAT = "tracedag.case/v1"
_ID = "0123456789abcdef"

_SPANS_SQL = """
with target as (
    select trace_id, span_id, start_time_unix_nano, conversation_id from spans
    where trace_id = '{trace}' and span_id = '{span}'
),
traces_in as (
    select t.trace_id from traces t, target x
    where t.trace_id = x.trace_id
       or (x.conversation_id is not null and t.conversation_id = x.conversation_id
           and t.start_time_unix_nano < x.start_time_unix_nano)
    union select trace_id from target
)
select s.trace_id, s.span_id, s.parent_span_id, s.name, cast(s.step_type as varchar) as step_type, s.step_name,
       s.tool_name, s.model, s.input_text, s.output_text, s.status_code, s.error_type, s.conversation_id,
       s.start_time_unix_nano, s.end_time_unix_nano, s.service_name, s.service_version, s.run_id, s.scenario_id,
       s.replay_index, s.variant_id,
       s.attributes['gen_ai.input.messages'] as input_messages,
       s.attributes['gen_ai.output.messages'] as output_messages,
       s.attributes['gen_ai.tool.call.arguments'] as tool_arguments,
       s.attributes['gen_ai.tool.call.result'] as tool_result,
       s.attributes['gen_ai.tool.call.id'] as tool_call_id,
       (s.trace_id = x.trace_id and s.span_id = x.span_id) as is_target,
       s.end_time_unix_nano <= x.start_time_unix_nano as before
from spans s, target x
where s.trace_id in (select trace_id from traces_in)
order by s.start_time_unix_nano, s.span_id
"""


def _check_id(value: str, width: int, what: str) -> str:
    text = value.strip().lower()
    if len(text) != width or any(c not in _ID for c in text):
        raise RegressError(f"{what} {value!r} is not a {width}-digit hex id")
    return text


def _json(text: Any) -> Any:
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _messages(raw: Any, fallback: Any, role: str) -> list[dict[str, str]]:
    """Messages as ``{role, content}`` from either GenAI form (``parts`` or ``content``)."""
    value = _json(raw)
    if not isinstance(value, list):
        return [{"role": role, "content": str(fallback)}] if fallback else []
    out = []
    for m in value:
        if not isinstance(m, dict):
            out.append({"role": role, "content": str(m)})
            continue
        parts = m.get("parts")
        if isinstance(parts, list):
            content = "".join(str(p.get("content", "")) for p in parts if isinstance(p, dict))
        else:
            content = str(m.get("content", ""))
        out.append({"role": str(m.get("role", role)), "content": content})
    return out


def _tool_call(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "kind": "tool_call", "span_id": row["span_id"], "name": row["tool_name"] or row["step_name"],
        "call_id": row["tool_call_id"], "arguments": _json(row["tool_arguments"] or row["input_text"]),
        "result": _json(row["tool_result"] or row["output_text"]),
        "status": "error" if row["status_code"] == 2 else "ok", "error_type": row["error_type"],
    }


def _history(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = []
    seen: list[tuple[str, str]] = []
    for row in rows:
        if not row["before"] or row["is_target"]:
            continue
        if row["step_type"] == "tool":
            history.append(_tool_call(row))
        elif row["step_type"] == "llm":
            for m in _messages(row["input_messages"], row["input_text"], "user") + _messages(
                    row["output_messages"], row["output_text"], "assistant"):
                key = (m["role"], m["content"])
                if key not in seen:
                    seen.append(key)
                    history.append({"kind": "message", "span_id": row["span_id"], **m})
    return history


def _step(row: dict[str, Any]) -> dict[str, Any]:
    if row["step_type"] == "tool":
        given: Any = _json(row["tool_arguments"] or row["input_text"])
        output: Any = _json(row["tool_result"] or row["output_text"])
    elif row["step_type"] == "llm":
        given = _messages(row["input_messages"], row["input_text"], "user")
        output = _messages(row["output_messages"], row["output_text"], "assistant")
    else:
        given, output = _json(row["input_text"]), _json(row["output_text"])
    return {
        "span_id": row["span_id"], "span_name": row["name"], "type": row["step_type"], "name": row["step_name"],
        "tool_name": row["tool_name"], "model": row["model"], "input": given,
        "expected": {"output": output, "status": "error" if row["status_code"] == 2 else "ok",
                     "error_type": row["error_type"]},
    }


def capture_case(data: Path, trace_id: str, span_id: str) -> dict[str, Any]:
    """The case document of the step ``span_id`` of trace ``trace_id`` (see the module docstring)."""
    trace, span = _check_id(trace_id, 32, "trace id"), _check_id(span_id, 16, "span id")
    rows = run_sql(data, _SPANS_SQL.format(trace=trace, span=span)).to_pylist()
    target = next((r for r in rows if r["is_target"]), None)
    if target is None:
        raise RegressError(f"no span {span} in trace {trace} (`tracedag show {trace}` lists its steps)")
    labels = {k: target[k] for k in ("service_name", "service_version", "run_id", "scenario_id", "replay_index",
                                     "variant_id") if target[k] is not None}
    return {
        "format": FORMAT,
        "source": {"trace_id": trace, "span_id": span, "conversation_id": target["conversation_id"],
                   "labels": labels},
        "step": _step(target),
        "history": _history(rows),
    }


def write_case(case: dict[str, Any], out: Path) -> Path:
    """Write the case as indented JSON (a file a person can read and edit)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(case, indent=2, default=str) + "\n", encoding="utf-8")
    return out
