"""A smolagents ToolCallingAgent traced by openinference-instrumentation-smolagents (run in its pinned venv).

    python smolagents_agent.py COLLECTOR_URL MODEL_BASE_URL SCENARIOS.json

Each scenario is a conversation: its turns run in order on one agent (``reset=False`` after the
first), inside OpenInference's ``using_session`` so every span carries ``session.id``. The model is
the scripted OpenAI-compatible server of the test; spans go through the real OTel SDK's OTLP/HTTP
exporter to the test's ``tracedag collect``. The tools fail the way the scenarios need: Atlantis's
weather backend times out, Lyon's fails once then answers, an unknown order id is answered with an
error payload (no exception), a taxi needs a city and an HH:MM time.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import fw_tools  # the shared tools (this script's folder is on sys.path)
from openinference.instrumentation import using_session
from openinference.instrumentation.smolagents import SmolagentsInstrumentor
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from smolagents import OpenAIServerModel, ToolCallingAgent, tool

CALLS = fw_tools.CALLS


# smolagents reads a tool's schema from its docstring's Args: section, so the docstrings stay here
@tool
def get_weather(city: str) -> str:
    """The weather of a city today.

    Args:
        city: the city's name
    """
    return fw_tools.get_weather(city)


@tool
def lookup_order(order_id: str) -> dict:
    """An order's status and tracking number.

    Args:
        order_id: the order id, e.g. A-1001
    """
    return fw_tools.lookup_order(order_id)


@tool
def book_taxi(city: str, time: str) -> str:
    """Book a taxi.

    Args:
        city: where
        time: when, HH:MM
    """
    return fw_tools.book_taxi(city, time)


def main(collector: str, model_url: str, scenarios: list[dict[str, Any]]) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "smolagents-demo"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{collector}/v1/traces")))
    SmolagentsInstrumentor().instrument(tracer_provider=provider)
    model = OpenAIServerModel(model_id="gpt-4o-mini", api_base=model_url, api_key="test-key",
                              client_kwargs={"max_retries": 0})
    for sc in scenarios:
        CALLS.clear()
        agent = ToolCallingAgent(tools=[get_weather, lookup_order, book_taxi], model=model,
                                 max_steps=sc.get("max_steps", 4), verbosity_level=0)
        with using_session(sc["conversation"]):
            for i, prompt in enumerate(sc["turns"]):
                try:
                    answer = agent.run(prompt, reset=i == 0)
                except Exception as exc:  # the run ended in an error: the spans say so
                    answer = f"{type(exc).__name__}: {exc}"
                print(json.dumps({"conversation": sc["conversation"], "turn": i + 1, "answer": str(answer)}))
    provider.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], json.loads(Path(sys.argv[3]).read_text()))
