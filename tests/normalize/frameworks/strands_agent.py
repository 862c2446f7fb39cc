"""A Strands agent with its native OpenTelemetry GenAI spans (run in its pinned venv).

    python strands_agent.py COLLECTOR_URL MODEL_BASE_URL SCENARIOS.json

Strands traces through the global tracer provider: this script sets one whose span processor is the
real OTel SDK's OTLP/HTTP exporter to the test's ``tracedag collect``. The model is Strands'
OpenAIModel against the scripted OpenAI-compatible server of the test (it streams). Each scenario is
a conversation: its turns run in order on one agent (its messages are the memory), the agent's
``trace_attributes`` carry ``session.id``. The tools are those of smolagents_agent.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import fw_tools  # the shared tools (this script's folder is on sys.path)
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from strands import Agent, tool
from strands.models.openai import OpenAIModel

CALLS = fw_tools.CALLS
get_weather = tool(fw_tools.get_weather)
lookup_order = tool(fw_tools.lookup_order)
book_taxi = tool(fw_tools.book_taxi)


def main(collector: str, model_url: str, scenarios: list[dict[str, Any]]) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "strands-demo"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{collector}/v1/traces")))
    trace.set_tracer_provider(provider)
    model = OpenAIModel(client_args={"base_url": model_url, "api_key": "test-key", "max_retries": 0},
                        model_id="gpt-4o-mini")
    for sc in scenarios:
        CALLS.clear()
        agent = Agent(model=model, tools=[get_weather, lookup_order, book_taxi], callback_handler=None,
                      trace_attributes={"session.id": sc["conversation"]})
        for i, prompt in enumerate(sc["turns"]):
            try:
                answer = str(agent(prompt)).strip()
            except Exception as exc:  # the run ended in an error: the spans say so
                answer = f"{type(exc).__name__}: {exc}"
            print(json.dumps({"conversation": sc["conversation"], "turn": i + 1, "answer": answer}), flush=True)
    provider.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], json.loads(Path(sys.argv[3]).read_text()))
