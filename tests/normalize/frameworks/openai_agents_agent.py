"""An OpenAI Agents SDK agent traced by openinference-instrumentation-openai-agents (run in its pinned venv).

    python openai_agents_agent.py COLLECTOR_URL MODEL_BASE_URL SCENARIOS.json

The SDK's own trace processors (the upload to OpenAI's tracing backend) are removed with
``set_trace_processors([])``; ``OpenAIAgentsInstrumentor().instrument(tracer_provider=...)`` then
registers OpenInference's processor as the only one, whose spans the real OTel SDK's OTLP/HTTP
exporter sends to the test's ``tracedag collect``. The model is the SDK's
``OpenAIChatCompletionsModel`` against the scripted OpenAI-compatible server of the test. Each scenario
is a conversation: its turns run in order inside OpenInference's ``using_session``, each turn's input
the previous turn's items plus the new prompt. The tools are those of smolagents_agent.py, and
``track_shipment``, which answers a tracking number no carrier knows (order A-2002's, stale) with a
404 error payload. A tool's exception goes to the SDK's default ``failure_error_function`` (the
model reads "An error occurred while running the tool", the span's error says "Tool execution
failed. Error details are redacted."), unless the scenario asks for ``"tool_errors": "raise"`` (no handler: the run ends) or
``"shown"`` (a handler that answers the exception's text, which the span then carries too).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    RunContextWrapper,
    Runner,
    function_tool,
    set_trace_processors,
)
from agents.tracing import get_trace_provider
from fw_tools import (  # the shared tools (this script's folder is on sys.path)
    CALLS,
    SHIPMENTS,
    book_taxi,
    get_weather,
    lookup_order,
)
from openai import AsyncOpenAI
from openinference.instrumentation import using_session
from openinference.instrumentation.openai_agents import OpenAIAgentsInstrumentor
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor


def track_shipment(tracking_no: str) -> dict[str, Any]:
    """Where a shipment is now, by its tracking number."""
    if tracking_no not in SHIPMENTS:
        return {"status": 404, "error": f"404 Not Found: no shipment with tracking number {tracking_no}"}
    return {"tracking_no": tracking_no, "status": SHIPMENTS[tracking_no]}


def shown(ctx: RunContextWrapper[Any], error: Exception) -> str:
    """A failure_error_function that tells the model (and so the span) what went wrong."""
    return f"{type(error).__name__}: {error}"


def tools(errors: str) -> list[Any]:
    """The function tools, with the error handling the scenario asks for."""
    fns = (get_weather, lookup_order, track_shipment, book_taxi)
    if errors == "raise":
        return [function_tool(f, failure_error_function=None) for f in fns]
    if errors == "shown":
        return [function_tool(f, failure_error_function=shown) for f in fns]
    return [function_tool(f) for f in fns]


def run_conversation(model: OpenAIChatCompletionsModel, sc: dict[str, Any]) -> None:
    """The scenario's turns, in order, each given the items of the turns before."""
    agent = Agent(name="assistant", instructions="Help the user with the tools.", model=model,
                  tools=tools(sc.get("tool_errors", "default")))
    items: list[Any] = []
    with using_session(sc["conversation"]):
        for i, prompt in enumerate(sc["turns"]):
            items.append({"role": "user", "content": prompt})
            try:
                result = Runner.run_sync(agent, items)
                items = result.to_input_list()
                answer = str(result.final_output)
            except Exception as exc:  # the run ended in an error: the spans say so
                answer = f"{type(exc).__name__}: {exc}"
            print(json.dumps({"conversation": sc["conversation"], "turn": i + 1, "answer": answer}), flush=True)


def main(collector: str, model_url: str, scenarios: list[dict[str, Any]]) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "openai-agents-demo"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{collector}/v1/traces")))
    set_trace_processors([])  # no upload to OpenAI's tracing backend
    OpenAIAgentsInstrumentor().instrument(tracer_provider=provider)
    registered = getattr(getattr(get_trace_provider(), "_multi_processor", None), "_processors", None)
    print(json.dumps({"trace_processors": [type(p).__name__ for p in registered or ()]}), flush=True)
    client = AsyncOpenAI(base_url=model_url, api_key="test-key", max_retries=0)
    model = OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=client)
    for sc in scenarios:
        CALLS.clear()
        run_conversation(model, sc)
    provider.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], json.loads(Path(sys.argv[3]).read_text()))
