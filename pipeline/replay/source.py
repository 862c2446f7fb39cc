"""The stored conversations a replay starts from: which ones, and their user turns in order.

A conversation is every trace sharing ``conversation_id`` (a trace without one is a conversation of
its own, named by its trace id). Its user turns, read from the normalized spans (so the three
dialects — OTel GenAI, OpenInference, OpenLLMetry — are read by one rule):

1. when any span of the conversation has ``gen_ai.user.message`` events (``tracedag.instrument.
   user_message``; agents that hold several turns in one trace record them so), their ``content``,
   in event time order;
2. otherwise one turn per trace, as ``queries/run_steps.sql`` reads ``user_input``: the
   ``input_text`` of the trace's earliest model call (``step_type = 'llm'``) that has one — the last
   user message of the call, whichever dialect carried it: ``gen_ai.input.messages``,
   ``llm.input_messages.N.message.*``, ``gen_ai.prompt.N.*`` — else its root span's ``input_text``
   (an agent traced as one step). A trace whose message equals the one before it continues that
   turn (an agent whose every model call is a trace of its own). Later model calls of a trace are
   not read: they may be the agent's own prompts (a LangGraph node writing a section), so an
   agent holding several turns in one trace records them as events (1).

Conversations that are themselves replays (``tracedag.replay_id`` on their spans) are left out
unless named with ``--conversation``. A conversation's own ``scenario_id``, ``variant_id`` and
``replay_index`` are read too: its replays keep them (``SourceConversation.scenario``), so a replay pairs with the
traffic it replays in ``tracedag regress`` and is checked by ``tracedag validate`` as its source.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tracedag.instrument.recorded import RecordedCall
from tracedag.pipeline.store.shared_macros import calls_shared_macros
from tracedag.pipeline.store.views import connect
from tracedag.schemas.errors import TracedagError

USER_EVENT = "gen_ai.user.message"
REPLAY_ID = "tracedag.replay_id"

CONVERSATIONS_SQL = f"""
select coalesce(conversation_id, trace_id) as conversation_id,
       arg_min(trace_id, start_time_unix_nano) as first_trace_id,
       count(distinct trace_id) as traces, count(*) as spans,
       min(start_time_unix_nano) as start_time_unix_nano, max(end_time_unix_nano) as end_time_unix_nano,
       bool_or(status_code = 2) as failed,
       arg_min(service_name, start_time_unix_nano)::varchar as service_name,
       max(service_version) as service_version,
       max(agent_name) as agent_name,
       max(scenario_id) as scenario_id,
       max(variant_id) as variant_id,
       max(replay_index) as replay_index,
       bool_or(attributes['{REPLAY_ID}'] is not null or resource_attributes['{REPLAY_ID}'] is not null)
         as is_replay
from spans
group by 1
"""
"""One row per stored conversation: the relation ``--where`` conditions are written over."""

EVENT_TURNS_SQL = f"""
select conversation_id, ev.attributes['content'] as text, ev.time_unix_nano as t, span_id
from (select coalesce(conversation_id, trace_id) as conversation_id, span_id, unnest(events) as ev
      from spans
      where len(events) > 0 and coalesce(conversation_id, trace_id) in (select unnest($ids)))
where ev.name = '{USER_EVENT}'
order by conversation_id, t, span_id
"""

LLM_TURNS_SQL = """
with s as (
    select coalesce(conversation_id, trace_id) as conversation_id, trace_id, span_id, parent_span_id,
           step_type::varchar as step_type, input_text, start_time_unix_nano
    from spans where coalesce(conversation_id, trace_id) in (select unnest($ids))
)
select any_value(conversation_id) as conversation_id,
       coalesce(min_by(input_text, start_time_unix_nano) filter (where step_type = 'llm' and input_text is not null),
                min_by(input_text, start_time_unix_nano) filter (where parent_span_id is null)) as text,
       min(start_time_unix_nano) as trace_start, trace_id
from s group by trace_id
order by conversation_id, trace_start, trace_id
"""


class ReplaySourceError(TracedagError):  # type: ignore[misc,unused-ignore]
    """A selection that finds nothing to replay, or a conversation without user turns."""


@dataclass(frozen=True)
class Selection:
    """Which stored conversations to replay (all given criteria must hold)."""

    conversations: tuple[str, ...] = ()
    where: str | None = None
    since_seconds: float | None = None
    failed_only: bool = False


@dataclass(frozen=True)
class SourceConversation:
    """One stored conversation to replay: its id, first trace, and the user's turns in order."""

    conversation_id: str
    first_trace_id: str
    turns: tuple[str, ...]
    failed: bool = False
    tool_calls: tuple[RecordedCall, ...] = ()  # filled for --tools recorded (``recording.recorded_calls``)
    scenario_id: str | None = None  # the source's own run labels, kept by its replays
    variant_id: str | None = None
    replay_index: int | None = None

    @property
    def scenario(self) -> str:
        """The scenario its replays carry: the source's ``scenario_id``, else the conversation itself."""
        return self.scenario_id or self.conversation_id


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_since(text: str) -> float:
    """``30m``, ``24h``, ``7d`` as seconds."""
    match = _DURATION.match(text)
    if match is None:
        raise ReplaySourceError(f"--since {text!r}: expected a duration such as 30m, 24h or 7d")
    return float(match.group(1)) * _UNIT[match.group(2)]


def _condition(sel: Selection) -> tuple[str, dict[str, object]]:
    parts: list[str] = []
    params: dict[str, object] = {}
    if sel.conversations:
        parts.append("(conversation_id in (select unnest($ids)) or first_trace_id in (select unnest($ids)))")
        params["ids"] = list(sel.conversations)
    else:
        parts.append("not is_replay")
    if sel.where:
        parts.append(f"({sel.where})")
    if sel.since_seconds is not None:
        parts.append("end_time_unix_nano >= $since")
        params["since"] = int((time.time() - sel.since_seconds) * 1e9)
    if sel.failed_only:
        parts.append("failed")
    return " and ".join(parts), params


def select_conversations(data: Path, sel: Selection) -> list[SourceConversation]:
    """The selected conversations with their user turns, oldest first.

    Raises ``ReplaySourceError`` naming an unknown conversation, a conversation without user
    turns, or a selection that matched nothing.
    """
    where, params = _condition(sel)
    con = connect(data, shared_macros=calls_shared_macros(where))  # only if --where calls one: our SQL calls none
    try:
        try:
            rows = con.execute(f"select * from ({CONVERSATIONS_SQL}) where {where} "
                               "order by start_time_unix_nano, conversation_id", params).fetchall()
        except Exception as e:
            raise ReplaySourceError(f"--where {sel.where!r}: {str(e).splitlines()[0]}") from e
        cols = [d[0] for d in con.description]
        found = [dict(zip(cols, r, strict=True)) for r in rows]
        _check_named(sel.conversations, found)
        if not found:
            raise ReplaySourceError("no stored conversation matches the selection")
        turns = read_turns(con, [str(r["conversation_id"]) for r in found])
    finally:
        con.close()
    out: list[SourceConversation] = []
    for r in found:
        cid = str(r["conversation_id"])
        if not turns.get(cid):
            raise ReplaySourceError(f"conversation {cid}: no user turns found in its spans "
                                    "(no gen_ai.user.message events, model-call inputs or root input)")
        out.append(SourceConversation(cid, str(r["first_trace_id"]), tuple(turns[cid]), bool(r["failed"]),
                                      scenario_id=_text(r["scenario_id"]), variant_id=_text(r["variant_id"]),
                                      replay_index=None if r["replay_index"] is None else int(r["replay_index"])))
    return out


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def _check_named(named: Sequence[str], found: list[dict[str, object]]) -> None:
    known = {str(r["conversation_id"]) for r in found} | {str(r["first_trace_id"]) for r in found}
    for cid in named:
        if cid not in known:
            raise ReplaySourceError(f"conversation {cid}: not found in the store (or not matched by the other filters)")


def read_turns(con: object, ids: list[str]) -> dict[str, list[str]]:
    """Each conversation's user turns (see the module docstring), consecutive repeats merged."""
    execute = con.execute  # type: ignore[attr-defined]
    out: dict[str, list[str]] = {}
    for cid, text, *_ in execute(EVENT_TURNS_SQL, {"ids": ids}).fetchall():
        if text:
            out.setdefault(str(cid), []).append(str(text))
    rest = [i for i in ids if i not in out]
    if rest:
        for cid, text, *_ in execute(LLM_TURNS_SQL, {"ids": rest}).fetchall():
            turns = out.setdefault(str(cid), [])
            if text and (not turns or turns[-1] != text):
                turns.append(str(text))
    return out
