"""Agents ``tracedag replay`` loads as ``module:function`` in the tests (each traced by tracedag.instrument)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from tracedag import instrument as td


def echo(history: list[dict[str, Any]]) -> str:
    """Reply with the user's last message and how many messages came before it."""
    with td.agent("echo") as step:
        step.set_input(history)
        reply = f"{len(history) - 1}: {history[-1]['content']}"
        step.set_output(reply)
        return reply


async def echo_async(history: list[dict[str, Any]]) -> str:
    """``echo``, as a coroutine."""
    await asyncio.sleep(0)
    return echo(history)


def breaks_on_second_turn(history: list[dict[str, Any]]) -> str:
    """Answer the first turn, raise on the second."""
    if len(history) > 1:
        raise RuntimeError("the agent lost its state")
    return echo(history)


_CLIENT: list[Any] = []


def openai_agent(history: list[dict[str, Any]]) -> str:
    """An agent on the official openai client, traced by opentelemetry-instrumentation-openai-v2 (plain
    OpenTelemetry: the replay's labels reach its spans through the global provider); the model is the
    chat-completions server at ``$FAKE_OPENAI_BASE_URL``."""
    if not _CLIENT:
        import openai
        from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

        OpenAIInstrumentor().instrument()
        _CLIENT.append(openai.OpenAI(base_url=os.environ["FAKE_OPENAI_BASE_URL"], api_key="test", max_retries=0))
    messages = [{"role": "system", "content": "You are a shop assistant."}, *history]
    reply = _CLIENT[0].chat.completions.create(model="gpt-4o-mini", messages=messages)
    return str(reply.choices[0].message.content or "")
