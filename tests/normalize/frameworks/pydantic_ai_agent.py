"""A pydantic-ai Agent with its native OpenTelemetry instrumentation (run in its pinned venv).

    python pydantic_ai_agent.py COLLECTOR_URL MODEL_BASE_URL SCENARIOS.json

``Agent.instrument_all(InstrumentationSettings(tracer_provider=...))`` (no logfire): the spans go
through the real OTel SDK's OTLP/HTTP exporter to the test's ``tracedag collect``. Each scenario is
a conversation (``conversation_id``), its turns run in order with the previous turns' messages as
history. The model is the scripted OpenAI-compatible server of the test. The tools fail the way the
scenarios need (the same tools as smolagents_agent.py): Atlantis's weather backend times out (an
exception that ends the run unless the scenario asks the tool to report it), Lyon's fails once with
``ModelRetry`` (pydantic-ai's retry), an unknown order id is answered with an error payload, a taxi
needs an HH:MM time (``ModelRetry`` with the reason).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from pydantic_ai import Agent, ModelRetry
from pydantic_ai.models.instrumented import InstrumentationSettings
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

CALLS: dict[str, int] = {}
ORDERS = {"A-1001": {"order_id": "A-1001", "status": "shipped", "tracking_no": "TRK-77123"}}


def get_weather(city: str) -> str:
    """The weather of a city today."""
    CALLS[city] = CALLS.get(city, 0) + 1
    if city == "Atlantis":
        raise TimeoutError("weather backend timed out after 10s")
    if city == "Lyon" and CALLS[city] == 1:
        raise ModelRetry("weather backend connection reset, try again")
    return f"{city}: 21C and sunny"


def lookup_order(order_id: str) -> dict[str, Any]:
    """An order's status and tracking number."""
    return ORDERS.get(order_id) or {"status": "error", "error": f"order {order_id} not found"}


def book_taxi(city: str, time: str) -> str:
    """Book a taxi in a city at a time, HH:MM."""
    if not re.fullmatch(r"\d\d:\d\d", time):
        raise ModelRetry(f"time must be HH:MM, got {time!r}")
    return f"taxi booked in {city} at {time}"


def main(collector: str, model_url: str, scenarios: list[dict[str, Any]]) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "pydantic-ai-demo"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{collector}/v1/traces")))
    Agent.instrument_all(InstrumentationSettings(tracer_provider=provider))
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=model_url, api_key="test-key", max_retries=0)
    model = OpenAIChatModel("gpt-4o-mini", provider=OpenAIProvider(openai_client=client))
    for sc in scenarios:
        CALLS.clear()
        agent = Agent(model, name="assistant", tools=[get_weather, lookup_order, book_taxi], retries=2)
        history: list[Any] = []
        for i, prompt in enumerate(sc["turns"]):
            try:
                result = agent.run_sync(prompt, message_history=history, conversation_id=sc["conversation"])
                history = result.all_messages()
                answer = str(result.output)
            except Exception as exc:  # the run ended in an error: the spans say so
                answer = f"{type(exc).__name__}: {exc}"
            print(json.dumps({"conversation": sc["conversation"], "turn": i + 1, "answer": answer}))
    provider.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], json.loads(Path(sys.argv[3]).read_text()))
