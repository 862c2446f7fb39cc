"""Spans captured from REAL instrumentation libraries driven by scripted fake models (no network).

Plain module shared by several test areas (``from realspans import ...``; tests/ is on sys.path
through ``tests/normalize/conftest.py`` or the importing area's own conftest):

- ``langgraph_spans()``: a LangGraph graph (router, tool node, agent/tool loop, ``Send`` fan-out,
  validator loop) traced by ``openinference-instrumentation-langchain``, plus LangGraph's own
  step metadata as ground truth (``LangGraphCapture.steps``);
- ``fake_openai_server()`` / ``openai_spans()``: the ``openai`` client traced by
  ``opentelemetry-instrumentation-openai-v2`` against a local chat-completions server;
- ``traceloop_spans()``: OpenLLMetry (traceloop) decorators workflow/task/agent/tool;
- ``genai_plain_spans()``: plain OTel SDK spans with GenAI attributes, old and new names;
- ``to_table(spans)``: OTLP-encode and convert with ``tracedag.pipeline.convert.records.requests_to_table``.

Caveat: OpenLLMetry's LangChain instrumentation does not fully uninstrument (its callback
handler survives, so a later OpenInference capture in the same process gets a foreign parent on
its graph root, and later OpenLLMetry captures may repeat a span). Capture OpenInference runs
before any OpenLLMetry run in a process when the call tree matters.
"""

from __future__ import annotations

import json
import operator
import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Annotated, Any, TypedDict

import pyarrow as pa
from langgraph.graph.message import add_messages
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.loopback import openai_client

RUN_LABELS = {
    "tracedag.run_id": "run-7",
    "tracedag.scenario_id": "weather-report",
    "tracedag.replay_index": 2,
    "tracedag.variant_id": "baseline",
}


@contextmanager
def environ(**values: str) -> Iterator[None]:
    """Set environment variables for the block, then put back what was there (or remove them)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextmanager
def capture(
    service: str, version: str = "1.4.0", **resource: Any
) -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    """Yield a tracer provider whose finished spans land in an in-memory exporter."""
    attrs = {"service.name": service, "service.version": version, **resource}
    provider = TracerProvider(resource=Resource.create(attrs))
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        yield provider, exporter
    finally:
        provider.shutdown()


def to_table(spans: Sequence[ReadableSpan], received_unix_nano: int = 1, batch_id: str = "b1") -> pa.Table:
    """OTLP-encode ``spans`` and convert them into a normalized ``spans`` table."""
    from tracedag.pipeline.convert.reference import requests_to_table

    return requests_to_table([(encode_spans(list(spans)), received_unix_nano, batch_id)])


# ----------------------------------------------------------------------------------------------
# LangGraph + OpenInference
# ----------------------------------------------------------------------------------------------

TOPICS = ("forecast", "packing", "transport")


class ReportState(TypedDict, total=False):
    """Graph state of the weather-report agent."""

    messages: Annotated[list[Any], add_messages]
    sections: Annotated[list[str], operator.add]
    checks: int
    route: str


class SectionState(TypedDict):
    """State handed to one ``write_section`` task by ``Send``."""

    topic: str


@dataclass
class LangGraphCapture:
    """Spans of one graph run plus LangGraph's own record of it."""

    spans: list[ReadableSpan]
    # one dict per executed task, from stream_mode="debug": step, node, triggers, task_id
    steps: list[dict[str, Any]] = field(default_factory=list)
    result: dict[str, Any] = field(default_factory=dict)
    thread_id: str = ""


def lookup_weather(city: str) -> str:
    """Return the weather of ``city`` (a fixed answer)."""
    return f"{city}: 21C and sunny"


def _ai(
    content: str, tool_calls: list[dict[str, Any]] | None = None, tokens: tuple[int, int] = (0, 0)
) -> Any:
    from langchain_core.messages import AIMessage

    usage = {"input_tokens": tokens[0], "output_tokens": tokens[1], "total_tokens": sum(tokens)}
    return AIMessage(content=content, tool_calls=tool_calls or [], usage_metadata=usage)


def _agent_model() -> Any:
    from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel

    call = {"name": "lookup_weather", "args": {"city": "Paris"}, "id": "call_weather_1", "type": "tool_call"}
    return FakeMessagesListChatModel(
        responses=[
            _ai("", [call], tokens=(31, 12)),
            _ai("Paris is 21C and sunny; writing the report.", tokens=(58, 9)),
        ]
    )


def build_report_graph() -> Any:
    """Compile the graph: classify -> (router) -> agent <-> tools loop -> Send fan-out -> validator loop."""
    from langchain_core.messages import HumanMessage
    from langgraph.graph import END, START, StateGraph
    from langgraph.prebuilt import ToolNode
    from langgraph.types import Send

    model = _agent_model()
    writer_lock = threading.Lock()

    def classify(state: ReportState) -> dict[str, Any]:
        text = state["messages"][-1].content
        return {"route": "weather" if "weather" in text.lower() else "smalltalk"}

    def smalltalk(state: ReportState) -> dict[str, Any]:
        return {"messages": [_ai("Hello!")]}

    def agent(state: ReportState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    def write_section(state: SectionState) -> dict[str, Any]:
        from langchain_core.language_models.fake_chat_models import FakeListChatModel

        with writer_lock:
            llm = FakeListChatModel(responses=[f"{state['topic'].title()}: take sunglasses."])
        text = llm.invoke([HumanMessage(content=f"Write the {state['topic']} section")])
        return {"sections": [text]}

    def validator(state: ReportState) -> dict[str, Any]:
        return {"checks": state.get("checks", 0) + 1}

    def fixer(state: ReportState) -> dict[str, Any]:
        return {"sections": ["Disclaimer: forecasts change."]}

    def route_request(state: ReportState) -> str:
        return "agent" if state["route"] == "weather" else "smalltalk"

    def route_agent(state: ReportState) -> Any:
        last = state["messages"][-1]
        if getattr(last, "tool_calls", None):
            return "tools"
        return [Send("write_section", {"topic": t}) for t in TOPICS]

    def route_validator(state: ReportState) -> str:
        return "fixer" if state["checks"] < 2 else END

    g = StateGraph(ReportState)
    g.add_node("classify", classify)
    g.add_node("smalltalk", smalltalk)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode([lookup_weather]))
    g.add_node("write_section", write_section)
    g.add_node("validator", validator)
    g.add_node("fixer", fixer)
    g.add_edge(START, "classify")
    g.add_conditional_edges("classify", route_request, ["agent", "smalltalk"])
    g.add_edge("smalltalk", END)
    g.add_conditional_edges("agent", route_agent, ["tools", "write_section"])
    g.add_edge("tools", "agent")
    g.add_edge("write_section", "validator")
    g.add_conditional_edges("validator", route_validator, ["fixer", END])
    g.add_edge("fixer", "validator")
    return g.compile()


_OPENLLMETRY: list[tuple[TracerProvider, InMemorySpanExporter]] = []


def _openllmetry_provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    if not _OPENLLMETRY:
        attrs = {"service.name": "weather-agent", "service.version": "1.4.0", **RUN_LABELS}
        provider = TracerProvider(resource=Resource.create(attrs))
        exporter = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        _OPENLLMETRY.append((provider, exporter))
    return _OPENLLMETRY[0]


def _stream_graph(
    graph: Any, question: str, config: dict[str, Any], steps: list[dict[str, Any]]
) -> dict[str, Any]:
    """Run the graph, appending LangGraph's own task records to ``steps``; return the final state."""
    from langchain_core.messages import HumanMessage

    result: dict[str, Any] = {}
    for mode, payload in graph.stream(
        {"messages": [HumanMessage(content=question)]}, config, stream_mode=["debug", "values"]
    ):
        if mode == "debug" and payload["type"] == "task":
            p = payload["payload"]
            steps.append(
                {
                    "step": payload["step"],
                    "node": p["name"],
                    "triggers": list(p["triggers"]),
                    "task_id": p["id"],
                }
            )
        elif mode == "values":
            result = payload
    return result


# Captures are made once per process and shared: OpenLLMetry leaves its callback handler behind
# after uninstrument(), so an OpenInference capture made after it would get a foreign parent.
# The first OpenLLMetry capture therefore makes the default OpenInference capture first.
_CAPTURES: dict[tuple[str, str, str], LangGraphCapture] = {}
_DEFAULT = ("conv-42", "What's the weather in Paris?")


def langgraph_spans(
    thread_id: str = _DEFAULT[0], question: str = _DEFAULT[1], dialect: str = "openinference"
) -> LangGraphCapture:
    """Return the spans and LangGraph's step record of one run of the report graph (cached per process).

    ``dialect`` picks the instrumentation: ``openinference`` (openinference-instrumentation-langchain)
    or ``openllmetry`` (OpenLLMetry's opentelemetry-instrumentation-langchain, what traceloop-sdk runs).
    """
    key = (thread_id, question, dialect)
    if key not in _CAPTURES:
        if dialect == "openinference" and any(k[2] == "openllmetry" for k in _CAPTURES):
            raise RuntimeError("capture OpenInference runs before any OpenLLMetry run in a process")
        if dialect == "openllmetry":
            langgraph_spans(*_DEFAULT, dialect="openinference")
        _CAPTURES[key] = _capture_langgraph(thread_id, question, dialect)
    cap = _CAPTURES[key]
    return LangGraphCapture(spans=list(cap.spans), steps=[dict(s) for s in cap.steps],
                            result=dict(cap.result), thread_id=cap.thread_id)


def _capture_langgraph(thread_id: str, question: str, dialect: str) -> LangGraphCapture:
    """Run the report graph once under the given instrumentation."""

    if dialect == "openinference":
        from openinference.instrumentation.langchain import LangChainInstrumentor as Instrumentor
    else:
        from opentelemetry.instrumentation.langchain import LangchainInstrumentor as Instrumentor

    graph = build_report_graph()
    config = {"configurable": {"thread_id": thread_id}, "recursion_limit": 40}
    steps: list[dict[str, Any]] = []
    result: dict[str, Any] = {}
    if dialect == "openinference":
        with capture("weather-agent", **RUN_LABELS) as (provider, exporter):
            instrumentor = Instrumentor()
            instrumentor.instrument(tracer_provider=provider)
            try:
                result = _stream_graph(graph, question, config, steps)
            finally:
                instrumentor.uninstrument()
            spans = list(exporter.get_finished_spans())
    else:
        # OpenLLMetry's callback handler keeps the tracer of its first instrument() call for the
        # life of the process, so every capture uses one process-wide provider.
        provider, exporter = _openllmetry_provider()
        exporter.clear()
        instrumentor = Instrumentor()
        instrumentor.instrument(tracer_provider=provider)
        try:
            result = _stream_graph(graph, question, config, steps)
        finally:
            instrumentor.uninstrument()
        spans = list(exporter.get_finished_spans())
        exporter.clear()
    return LangGraphCapture(spans=spans, steps=steps, result=result, thread_id=thread_id)


# ----------------------------------------------------------------------------------------------
# openai client + opentelemetry-instrumentation-openai-v2 against a local chat-completions server
# ----------------------------------------------------------------------------------------------


def chat_completion(
    content: str | None,
    tool_calls: list[dict[str, Any]] | None = None,
    tokens: tuple[int, int] = (11, 7),
    model: str = "gpt-4o-mini-2024-07-18",
) -> dict[str, Any]:
    """Return an OpenAI chat-completions response body with one choice."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": json.dumps(c["args"])},
            }
            for c in tool_calls
        ]
    return {
        "id": f"chatcmpl-{abs(hash((content, model))) % 10**8:08d}",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls" if tool_calls else "stop"}
        ],
        "usage": {"prompt_tokens": tokens[0], "completion_tokens": tokens[1], "total_tokens": sum(tokens)},
    }


@dataclass
class FakeOpenAI:
    """A running local server: ``base_url`` for the client, ``requests`` it received (JSON bodies)."""

    base_url: str
    requests: list[dict[str, Any]]
    replies: list[tuple[int, dict[str, Any]]]


@contextmanager
def fake_openai_server(replies: Sequence[tuple[int, dict[str, Any]]]) -> Iterator[FakeOpenAI]:
    """Serve scripted (status, body) replies to POST /v1/chat/completions on 127.0.0.1, port 0."""
    state = FakeOpenAI(base_url="", requests=[], replies=list(replies))
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with lock:
                state.requests.append(json.loads(body or b"{}"))
                status, reply = (
                    state.replies.pop(0) if state.replies else (500, {"error": {"message": "no reply"}})
                )
            if not self.path.endswith("/chat/completions"):
                status, reply = 404, {"error": {"message": f"unknown path {self.path}"}}
            data = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    # shutdown() waits for the serving loop's next poll: 0.05 s, not the default 0.5 s (a test holds ~20 of these)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    state.base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def openai_spans(latest: bool = True, conversation_id: str = "conv-openai-1") -> list[ReadableSpan]:
    """Run a tool-calling chat turn (2 completions, 1 tool) and a failing call through the openai client.

    ``latest`` selects the current GenAI conventions (``OTEL_SEMCONV_STABILITY_OPT_IN=
    gen_ai_latest_experimental``, messages on spans); otherwise the instrumentation's default
    (older attribute names). The application adds an ``execute_tool`` span and a parent
    ``invoke_agent`` span carrying ``gen_ai.conversation.id`` as the GenAI conventions describe.
    """
    import os

    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

    env = {"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "SPAN_ONLY" if latest else "NO_CONTENT"}
    if latest:
        env["OTEL_SEMCONV_STABILITY_OPT_IN"] = "gen_ai_latest_experimental"
    saved = {k: os.environ.get(k) for k in [*env, "OTEL_SEMCONV_STABILITY_OPT_IN"]}
    replies = [
        (
            200,
            chat_completion(
                None, [{"id": "call_w1", "name": "lookup_weather", "args": {"city": "Paris"}}], (42, 17)
            ),
        ),
        (200, chat_completion("It is 21C and sunny in Paris.", tokens=(80, 12))),
        (500, {"error": {"message": "upstream overloaded", "type": "server_error"}}),
    ]
    os.environ.pop("OTEL_SEMCONV_STABILITY_OPT_IN", None)
    os.environ.update(env)
    try:
        with (
            fake_openai_server(replies) as srv,
            capture("openai-agent", **RUN_LABELS) as (provider, exporter),
        ):
            instrumentor = OpenAIInstrumentor()
            instrumentor.instrument(tracer_provider=provider)
            try:
                client = openai_client(srv.base_url, api_key="test-key", max_retries=0)
                _openai_turn(client, provider.get_tracer("weather-app"), conversation_id)
            finally:
                instrumentor.uninstrument()
            return list(exporter.get_finished_spans())
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _openai_turn(client: Any, tracer: Any, conversation_id: str) -> None:
    import openai

    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a weather assistant."},
        {"role": "user", "content": "What's the weather in Paris?"},
    ]
    agent_attrs = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "weather_assistant",
        "gen_ai.conversation.id": conversation_id,
    }
    with tracer.start_as_current_span("invoke_agent weather_assistant", attributes=agent_attrs):
        first = client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=[WEATHER_TOOL])
        call = first.choices[0].message.tool_calls[0]
        tool_attrs = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": call.function.name,
            "gen_ai.tool.call.id": call.id,
            "gen_ai.tool.call.arguments": call.function.arguments,
        }
        with tracer.start_as_current_span(
            f"execute_tool {call.function.name}", attributes=tool_attrs
        ) as span:
            result = lookup_weather(**json.loads(call.function.arguments))
            span.set_attribute("gen_ai.tool.call.result", result)
        messages += [
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": result},
        ]
        client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=[WEATHER_TOOL])
        try:
            client.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": "again"}]
            )
        except openai.InternalServerError:
            time.sleep(0)


# ----------------------------------------------------------------------------------------------
# Plain OTel SDK spans with GenAI attributes (old and new names) and evaluation carriers
# ----------------------------------------------------------------------------------------------


def genai_plain_spans() -> list[ReadableSpan]:
    """Emit, with the plain OTel SDK, one agent turn twice: new GenAI names and old ones.

    Trace 1 (new names): ``invoke_agent`` (conversation ``conv-new``) > ``chat gpt-4o`` with
    messages JSON and a ``gen_ai.evaluation.result`` event, ``execute_tool get_time`` that fails
    with an exception event. Trace 2 (old names, conversation ``conv-old`` on the root only):
    ``chat`` with ``gen_ai.system``, ``gen_ai.usage.prompt_tokens``/``completion_tokens`` and
    indexed ``gen_ai.prompt.N.*``/``gen_ai.completion.N.*``; an OpenInference-annotated span; an
    EVALUATOR span linked to the chat span; an evaluation event matched by ``gen_ai.response.id``;
    and a span of an unknown dialect (``Job 0x7f3a run 12``).
    """
    with capture("plain-genai", **RUN_LABELS) as (provider, exporter):
        tracer = provider.get_tracer("plain.app", "0.1")
        _new_names_trace(tracer)
        _old_names_trace(tracer)
        return list(exporter.get_finished_spans())


def _new_names_trace(tracer: Any) -> None:
    from opentelemetry.trace import Status, StatusCode

    root_attrs = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "clock_agent",
        "gen_ai.conversation.id": "conv-new",
        "gen_ai.provider.name": "openai",
    }
    with tracer.start_as_current_span("invoke_agent clock_agent", attributes=root_attrs):
        chat = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "openai",
            "gen_ai.request.model": "gpt-4o",
            "gen_ai.response.model": "gpt-4o-2024-08-06",
            "gen_ai.response.id": "resp-new-1",
            "gen_ai.usage.input_tokens": 120,
            "gen_ai.usage.output_tokens": 30,
            "gen_ai.response.finish_reasons": ["tool_call"],
            "gen_ai.input.messages": json.dumps(
                [
                    {"role": "system", "parts": [{"type": "text", "content": "Tell the time."}]},
                    {"role": "user", "parts": [{"type": "text", "content": "What time is it in Tokyo?"}]},
                ]
            ),
            "gen_ai.output.messages": json.dumps(
                [
                    {
                        "role": "assistant",
                        "finish_reason": "tool_call",
                        "parts": [
                            {
                                "type": "tool_call",
                                "id": "call_t1",
                                "name": "get_time",
                                "arguments": {"tz": "Asia/Tokyo"},
                            }
                        ],
                    },
                ]
            ),
        }
        with tracer.start_as_current_span("chat gpt-4o", attributes=chat) as span:
            span.add_event(
                "gen_ai.evaluation.result",
                {
                    "gen_ai.evaluation.name": "tool_choice",
                    "gen_ai.evaluation.score.value": 0.9,
                    "gen_ai.evaluation.score.label": "pass",
                    "gen_ai.evaluation.explanation": "picked get_time",
                },
            )
        tool = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "get_time",
            "gen_ai.tool.call.id": "call_t1",
            "gen_ai.tool.call.arguments": '{"tz": "Asia/Tokyo"}',
        }
        with tracer.start_as_current_span(
            "execute_tool get_time", attributes=tool, record_exception=False, set_status_on_exception=False
        ) as span:
            span.record_exception(TimeoutError("clock service timed out"))
            span.set_status(Status(StatusCode.ERROR, "clock service timed out"))


def _old_names_trace(tracer: Any) -> None:
    from opentelemetry.trace import Link

    with tracer.start_as_current_span("agent run", attributes={"gen_ai.conversation.id": "conv-old"}):
        chat = {
            "gen_ai.system": "openai",
            "gen_ai.request.model": "gpt-3.5-turbo",
            "gen_ai.response.model": "gpt-3.5-turbo-0125",
            "gen_ai.response.id": "resp-old-1",
            "gen_ai.usage.prompt_tokens": 25,
            "gen_ai.usage.completion_tokens": 8,
            "llm.request.type": "chat",
            "gen_ai.prompt.0.role": "system",
            "gen_ai.prompt.0.content": "Be brief.",
            "gen_ai.prompt.1.role": "user",
            "gen_ai.prompt.1.content": "Say hi",
            "gen_ai.completion.0.role": "assistant",
            "gen_ai.completion.0.content": "Hi!",
            "gen_ai.completion.0.finish_reason": "stop",
        }
        with tracer.start_as_current_span("openai.chat", attributes=chat) as chat_span:
            chat_ctx = chat_span.get_span_context()
        annotated = {
            "openinference.span.kind": "CHAIN",
            "input.value": "greet",
            "output.value": "Hi!",
            "annotations.0.annotation.name": "helpfulness",
            "annotations.0.annotation.score": 4,
            "annotations.0.annotation.label": "good",
            "annotations.0.annotation.annotator_kind": "HUMAN",
            "evaluations.0.evaluation.name": "toxicity",
            "evaluations.0.evaluation.score": 0.0,
            "evaluations.0.evaluation.label": "clean",
            "evaluations.0.evaluation.explanation": "no insults",
        }
        with tracer.start_as_current_span("greeting", attributes=annotated):
            pass
        with tracer.start_as_current_span("Job 0x7f3a run 12", attributes={"custom.thing": "x"}):
            pass
    evaluator = {
        "openinference.span.kind": "EVALUATOR",
        "annotations.0.annotation.name": "correctness",
        "annotations.0.annotation.score": 1,
        "annotations.0.annotation.label": "correct",
        "annotations.0.annotation.explanation": "matches",
        "annotations.0.annotation.annotator_kind": "LLM",
    }
    with tracer.start_as_current_span("evaluate correctness", attributes=evaluator, links=[Link(chat_ctx)]):
        pass
    with tracer.start_as_current_span("offline eval") as span:
        span.add_event(
            "gen_ai.evaluation.result",
            {
                "gen_ai.evaluation.name": "brevity",
                "gen_ai.evaluation.score.value": 5.0,
                "gen_ai.response.id": "resp-old-1",
            },
        )
