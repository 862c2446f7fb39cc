"""The tool calls of stored conversations, as recordings a replay serves (``--tools recorded``).

Each tool span (``step_type = 'tool'``) of a source conversation, in start order, becomes a
``tracedag.instrument.RecordedCall``: its ``tool_name``; arguments from ``gen_ai.tool.call.arguments``,
else OpenInference ``input.value``, else ``input_text``; result from ``gen_ai.tool.call.result``,
else ``output.value``, else ``output_text``; a span with status ERROR is a recorded failure
(``error_type``, status message). Each run gets a fresh ``ToolRecording`` of its source.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from tracedag.instrument.recorded import RecordedCall
from tracedag.pipeline.replay.source import SourceConversation
from tracedag.pipeline.store.views import connect

TOOL_CALLS_SQL = """
select coalesce(conversation_id, trace_id) as conversation_id, tool_name,
       coalesce(attributes['gen_ai.tool.call.arguments'], attributes['input.value'], input_text) as arguments,
       coalesce(attributes['gen_ai.tool.call.result'], attributes['output.value'], output_text) as result,
       status_code = 2 as failed, coalesce(error_type, 'error') as error_type, status_message
from spans
where step_type = 'tool' and tool_name is not null
  and coalesce(conversation_id, trace_id) in (select unnest($ids))
order by conversation_id, start_time_unix_nano, span_id
"""


def recorded_calls(data: Path, conversation_ids: Sequence[str]) -> dict[str, list[RecordedCall]]:
    """Every recorded tool call of each conversation, in order."""
    out: dict[str, list[RecordedCall]] = {c: [] for c in conversation_ids}
    con = connect(data, shared_macros=False)  # plain views: this SQL calls no shared query macro
    try:
        rows = con.execute(TOOL_CALLS_SQL, {"ids": list(conversation_ids)}).fetchall()
    finally:
        con.close()
    for cid, name, arguments, result, failed, error_type, message in rows:
        call = RecordedCall(str(name), arguments, None if failed else result,
                            str(error_type) if failed else None, str(message or ""))
        out.setdefault(str(cid), []).append(call)
    return out


def with_tool_calls(data: Path, sources: Sequence[SourceConversation]) -> list[SourceConversation]:
    """``sources`` with their recorded tool calls."""
    calls = recorded_calls(data, [s.conversation_id for s in sources])
    return [dataclasses.replace(s, tool_calls=tuple(calls.get(s.conversation_id, ()))) for s in sources]
