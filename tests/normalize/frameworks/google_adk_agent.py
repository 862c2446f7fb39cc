"""A Google ADK LlmAgent with ADK's native OpenTelemetry spans (run in its pinned venv).

    python google_adk_agent.py COLLECTOR_URL MODEL_BASE_URL SCENARIOS.json

ADK traces through the global tracer provider: this script sets one whose span processor is the
real OTel SDK's OTLP/HTTP exporter to the test's ``tracedag collect``. ADK 2 emits spans aligned
with the OTel GenAI conventions (``invoke_workflow``, ``invoke_agent``, ``generate_content``,
``execute_tool``); their content (messages, tool arguments and results) is recorded only when
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` asks for it on spans, which this script does. The model is ADK's ``LiteLlm`` (``openai/gpt-4o-mini``)
against the scripted OpenAI-compatible server of the test. Each scenario is a conversation: an ADK
session whose id is the conversation's, its turns run in order by an ``InMemoryRunner`` (the
session's events are the memory). A tool's exception ends the run, unless the scenario asks for
``"plugin": "reflect_retry"``: ADK's ``ReflectAndRetryToolPlugin`` then answers the model with its
``ERROR_HANDLED_BY_REFLECT_AND_RETRY_PLUGIN`` payload as the tool's result. The tools are those of
smolagents_agent.py, and ``track_shipment``, which raises "404 Not Found" for a tracking number no
carrier knows (order A-2002's, stale).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm reads no price list from the network
# ADK 2's spans (OTel GenAI semconv aligned) carry messages, tool arguments and results only with this switch
os.environ.setdefault("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "SPAN_ONLY")

from fw_tools import (  # the shared tools (this script's folder is on sys.path)
    CALLS,
    SHIPMENTS,
    book_taxi,
    get_weather,
    lookup_order,
)
from google.adk.agents import LlmAgent
from google.adk.models.lite_llm import LiteLlm
from google.adk.plugins import ReflectAndRetryToolPlugin
from google.adk.runners import InMemoryRunner
from google.genai import types
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor


def track_shipment(tracking_no: str) -> str:
    """Where a shipment is now, by its tracking number."""
    if tracking_no not in SHIPMENTS:
        raise LookupError(f"404 Not Found: no shipment with tracking number {tracking_no}")
    return SHIPMENTS[tracking_no]


async def run_conversation(model: LiteLlm, sc: dict[str, Any]) -> None:
    """The scenario's turns, in order, in one ADK session named after the conversation."""
    agent = LlmAgent(name="assistant", model=model, instruction="Help the user with the tools.",
                     tools=[get_weather, lookup_order, track_shipment, book_taxi])
    plugins = [ReflectAndRetryToolPlugin(max_retries=2)] if sc.get("plugin") == "reflect_retry" else []
    runner = InMemoryRunner(agent=agent, app_name="adk-demo", plugins=plugins)
    await runner.session_service.create_session(app_name="adk-demo", user_id="user", session_id=sc["conversation"])
    for i, prompt in enumerate(sc["turns"]):
        message = types.Content(role="user", parts=[types.Part(text=prompt)])
        texts: list[str] = []
        try:
            async for event in runner.run_async(user_id="user", session_id=sc["conversation"], new_message=message):
                texts += [p.text for p in (event.content.parts if event.content else []) or [] if p.text]
            answer = " ".join(texts).strip()
        except Exception as exc:  # the run ended in an error: the spans say so
            answer = f"{type(exc).__name__}: {exc}"
        print(json.dumps({"conversation": sc["conversation"], "turn": i + 1, "answer": answer}), flush=True)
    await runner.close()


def main(collector: str, model_url: str, scenarios: list[dict[str, Any]]) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "google-adk-demo"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{collector}/v1/traces")))
    trace.set_tracer_provider(provider)
    model = LiteLlm(model="openai/gpt-4o-mini", api_base=model_url, api_key="test-key", num_retries=0)
    for sc in scenarios:
        CALLS.clear()
        asyncio.run(run_conversation(model, sc))
    provider.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], json.loads(Path(sys.argv[3]).read_text()))
