"""The step helpers users call: ``agent``, ``node``, ``llm``, ``tool``.

Attributes (OTel GenAI semantic conventions, v1.41 names; nodes follow the proposed
``invoke_node`` convention, semantic-conventions-genai #187):

| helper | span name | attributes |
|---|---|---|
| ``agent`` | ``invoke_agent {name}`` | ``gen_ai.operation.name=invoke_agent``, ``gen_ai.agent.name|id|description|version`` |
| ``node`` | ``invoke_node {name}`` | ``gen_ai.operation.name=invoke_node``, ``gen_ai.node.name``, ``graph.node.id|name``, ``gen_ai.node.execution.id``, ``gen_ai.node.previous_execution.id`` |
| ``llm`` | ``chat {model}`` | ``gen_ai.operation.name=chat``, ``gen_ai.request.model``, ``gen_ai.provider.name``, messages, usage, finish reasons |
| ``tool`` | ``execute_tool {name}`` | ``gen_ai.operation.name=execute_tool``, ``gen_ai.tool.name|type|call.id|call.arguments|call.result`` |
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from tracedag.instrument import setup
from tracedag.instrument.steps import Message, Step, StepSpec, messages_json, to_json

logger = logging.getLogger(__name__)


def agent(
    name: str,
    *,
    agent_id: str | None = None,
    description: str | None = None,
    version: str | None = None,
    new_span: bool = True,
) -> StepSpec:
    """An agent invocation (``invoke_agent``); nodes inside it are chained in order."""
    attrs = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": name,
        "gen_ai.agent.id": agent_id,
        "gen_ai.agent.description": description,
        "gen_ai.agent.version": version,
    }
    return StepSpec(f"invoke_agent {name}", attrs, new_span=new_span, opens_chain=True)


def node(name: str, *, node_id: str | None = None, new_span: bool = True) -> StepSpec:
    """A graph node (``invoke_node``), linked to the node that ran before it in the same agent."""
    attrs = {
        "gen_ai.operation.name": "invoke_node",
        "gen_ai.node.name": name,
        "graph.node.id": node_id or name,
        "graph.node.name": name,
    }
    return StepSpec(f"invoke_node {name}", attrs, new_span=new_span, is_node=True)


def llm(
    model: str,
    *,
    provider: str = "unknown",
    operation: str = "chat",
    input_messages: Sequence[Message] | None = None,
    new_span: bool = True,
) -> StepSpec:
    """A model call; as a decorator, a returned string is recorded as the assistant reply."""
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": operation,
        "gen_ai.request.model": model,
        "gen_ai.provider.name": provider,
    }
    if input_messages is not None and setup.capture_content():
        attrs["gen_ai.input.messages"] = messages_json(input_messages)
    return StepSpec(f"{operation} {model}", attrs, new_span=new_span, on_return=_record_reply)


def tool(
    name: str,
    *,
    call_id: str | None = None,
    arguments: Mapping[str, Any] | None = None,
    description: str | None = None,
    tool_type: str = "function",
    new_span: bool = True,
) -> StepSpec:
    """A tool execution; as a decorator, the call's arguments and return value are recorded."""
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": name,
        "gen_ai.tool.type": tool_type,
        "gen_ai.tool.call.id": call_id,
        "gen_ai.tool.description": description,
    }
    if arguments is not None and setup.capture_content():
        attrs["gen_ai.tool.call.arguments"] = to_json(dict(arguments))
    return StepSpec(
        f"execute_tool {name}", attrs, new_span=new_span, on_call=_record_arguments, on_return=_record_result,
        tool=(name, dict(arguments) if arguments is not None else None),
    )


def user_message(text: str) -> None:
    """Record a message the user sent on the current span, as a ``gen_ai.user.message`` event.

    For agents that hold several user turns in one trace: ``tracedag replay`` reads a conversation's
    user turns from these events first (attribute ``content``), in their order.
    """
    from opentelemetry import trace

    span = trace.get_current_span()
    if text and span.is_recording() and setup.capture_content():
        span.add_event(USER_MESSAGE_EVENT, {"content": text})


USER_MESSAGE_EVENT = "gen_ai.user.message"


def _record_reply(step: Step, result: object) -> None:
    if isinstance(result, str):
        step.set_output(result)


def _record_arguments(step: Step, arguments: Mapping[str, Any]) -> None:
    if setup.capture_content():
        step.set("gen_ai.tool.call.arguments", to_json(dict(arguments)))


def _record_result(step: Step, result: object) -> None:
    step.set_result(result)
