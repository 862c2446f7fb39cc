"""A LlamaIndex FunctionAgent (agent workflows) traced by openinference-instrumentation-llama-index (pinned venv).

    python llama_index_agent.py COLLECTOR_URL MODEL_BASE_URL SCENARIOS.json

Each scenario is a conversation: its turns run in order on one agent with one ``Context`` (the
memory of the previous turns), inside OpenInference's ``using_session``. The model is the scripted
OpenAI-compatible server of the test (no streaming); spans go through the real OTel SDK's OTLP/HTTP
exporter to the test's ``tracedag collect``. The tools are those of smolagents_agent.py.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from fw_tools import (  # the shared tools (this script's folder is on sys.path)
    CALLS,
    book_taxi,
    get_weather,
    lookup_order,
)
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.workflow import Context
from llama_index.llms.openai import OpenAI
from openinference.instrumentation import using_session
from openinference.instrumentation.llama_index import LlamaIndexInstrumentor
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor


async def conversation(llm: OpenAI, sc: dict[str, Any]) -> None:
    agent = FunctionAgent(tools=[get_weather, lookup_order, book_taxi], llm=llm, streaming=False,
                          system_prompt="You help with weather, orders and taxis.")
    ctx = Context(agent)
    for i, prompt in enumerate(sc["turns"]):
        try:
            answer = str(await agent.run(prompt, ctx=ctx))
        except Exception as exc:  # the run ended in an error: the spans say so
            answer = f"{type(exc).__name__}: {exc}"
        print(json.dumps({"conversation": sc["conversation"], "turn": i + 1, "answer": answer}), flush=True)


def main(collector: str, model_url: str, scenarios: list[dict[str, Any]]) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "llama-index-demo"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{collector}/v1/traces")))
    LlamaIndexInstrumentor().instrument(tracer_provider=provider)
    llm = OpenAI(model="gpt-4o-mini", api_base=model_url, api_key="test-key", max_retries=0)
    for sc in scenarios:
        CALLS.clear()
        with using_session(sc["conversation"]):
            asyncio.run(conversation(llm, sc))
    provider.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], json.loads(Path(sys.argv[3]).read_text()))
