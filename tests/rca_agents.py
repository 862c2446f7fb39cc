"""Agents traced by REAL instrumentation with faults whose root cause is known (issue #18 classes 2 and 5).

Plain module used by tests/dag/test_skew_real.py, tests/score/test_paramgen_real.py and
bench/rca_accuracy.py. Every conversation is one trace: an agent span, the official ``openai``
client against a local scripted chat-completions server (``tests.realspans.fake_openai_server``)
traced by ``opentelemetry-instrumentation-openai-v2`` (with message content: call ids; without:
timestamps only) or ``openinference-instrumentation-openai``, and the application's tool spans.

- ``paramgen_cases()`` (class 2): the model writes arguments the tool rejects (a field it does not
  have, a missing field, text that is not JSON, one bad call of two), with a guardrail model call
  between call and tool, recovered by a corrected call, and a control whose tool fails on its own.
- ``skew_cases()`` (class 5): the tool is served by a second process (``tests.remote_tool_server``,
  another ``service.name``, its clock off by a few hundred ms) through ``httpx`` traced by
  ``opentelemetry-instrumentation-httpx`` (CLIENT spans; ``traceparent`` over real HTTP) and
  ``opentelemetry-instrumentation-wsgi`` on the server (SERVER spans).

Each case knows its truth: the span id of the root cause (None: the conversation does not fail) and,
for remote calls, the (client, server) span id pairs.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.loopback import http_client, openai_client
from tests.realspans import WEATHER_TOOL, capture, chat_completion, environ, fake_openai_server

DIALECTS = ("openai-v2", "openai-v2-no-content", "openinference")


@dataclass
class Case:
    """One traced conversation and its truth."""

    name: str
    dialect: str
    requests: list[bytes]  # OTLP ExportTraceServiceRequest bodies (the agent's, then the remote service's)
    root_span_id: str | None  # the true root cause; None when the conversation does not fail
    remote_calls: list[tuple[str, str]] = field(default_factory=list)  # (client span id, server span id)
    made_up: bool = False  # the root cause is a model step that made the arguments up


def _hex(span: Any) -> str:
    return format(span.get_span_context().span_id, "016x")


def _call(cid: str, name: str, args: Any) -> dict[str, Any]:
    return {"id": cid, "name": name, "args": args}


def _reply(content: str | None, calls: list[dict[str, Any]] | None = None) -> tuple[int, dict[str, Any]]:
    body = chat_completion(content, calls)
    for c, tc in zip(calls or [], body["choices"][0]["message"].get("tool_calls") or [], strict=False):
        if isinstance(c["args"], str):  # arguments that are not JSON, as the model wrote them
            tc["function"]["arguments"] = c["args"]
    return 200, body


def lookup_weather(city: str) -> str:
    """The local tool: the weather of ``city``; the backend times out for Atlantis."""
    if city == "Atlantis":
        raise TimeoutError("weather backend timed out after 10s")
    return f"{city}: 21C and sunny"


@contextmanager
def _instrumented(dialect: str) -> Iterator[tuple[Any, Any]]:
    """A tracer provider with the dialect's openai instrumentation on; yields (provider, exporter)."""
    if dialect == "openinference":
        from openinference.instrumentation.openai import OpenAIInstrumentor as Instrumentor
    else:
        from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor as Instrumentor
    content = "NO_CONTENT" if dialect.endswith("no-content") else "SPAN_ONLY"
    with (environ(OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=content,
                  OTEL_SEMCONV_STABILITY_OPT_IN="gen_ai_latest_experimental"),
          capture("weather-agent") as (provider, exporter)):
        instrumentor = Instrumentor()
        instrumentor.instrument(tracer_provider=provider)
        try:
            yield provider, exporter
        finally:
            instrumentor.uninstrument()


class Agent:
    """A minimal tool-calling agent loop, traced the way applications do with each dialect."""

    def __init__(self, dialect: str, base_url: str, tracer: Any, exporter: Any,
                 tools: dict[str, Callable[..., str]], guardrail: bool = False, raise_on_error: bool = False):

        self.dialect, self.tracer, self.exporter, self.tools = dialect, tracer, exporter, tools
        self.client = openai_client(base_url, api_key="test-key", max_retries=0)
        self.guardrail, self.raise_on_error = guardrail, raise_on_error
        self.llm_spans: list[str] = []  # span id of each model call, in order
        self.tool_spans: list[str] = []

    def _agent_attrs(self, conversation: str) -> dict[str, Any]:
        if self.dialect == "openinference":
            return {"openinference.span.kind": "AGENT", "agent.name": "weather_assistant", "session.id": conversation}
        return {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "weather_assistant",
                "gen_ai.conversation.id": conversation}

    def _tool_attrs(self, call: Any) -> dict[str, Any]:
        if self.dialect == "openinference":
            return {"openinference.span.kind": "TOOL", "tool.name": call.function.name,
                    "input.value": call.function.arguments}
        return {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": call.function.name,
                "gen_ai.tool.call.id": call.id, "gen_ai.tool.call.arguments": call.function.arguments}

    def _chat(self, messages: list[dict[str, Any]], tools: bool = True) -> Any:
        kwargs: dict[str, Any] = {"tools": [WEATHER_TOOL]} if tools else {}
        out = self.client.chat.completions.create(model="gpt-4o-mini", messages=messages, **kwargs)
        self.llm_spans.append(_hex(self.exporter.get_finished_spans()[-1]))
        return out

    def run(self, question: str, conversation: str, turns: int = 3) -> None:
        """Answer ``question``: model calls and tool calls until the model answers (or gives up)."""
        with self.tracer.start_as_current_span("invoke_agent weather_assistant",
                                               attributes=self._agent_attrs(conversation)):
            messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
            for _ in range(turns):
                reply = self._chat(messages).choices[0].message
                if not reply.tool_calls:
                    return
                if self.guardrail:  # a moderation model call between the tool call and the tool
                    self._chat([{"role": "user", "content": f"Is this call safe? {reply.tool_calls[0].function}"}],
                               tools=False)
                messages.append(reply.model_dump(exclude_none=True))
                failed = False
                for call in reply.tool_calls:
                    result, ok = self._tool(call)
                    failed = failed or not ok
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
                if failed and self.raise_on_error:
                    raise RuntimeError("the weather tool failed; giving up")

    def _tool(self, call: Any) -> tuple[str, bool]:
        from opentelemetry.trace import Status, StatusCode

        with self.tracer.start_as_current_span(f"execute_tool {call.function.name}", attributes=self._tool_attrs(call),
                                               record_exception=False, set_status_on_exception=False) as span:
            self.tool_spans.append(_hex(span))
            try:
                result = self.tools[call.function.name](**json.loads(call.function.arguments))
            except Exception as e:  # the application reports the error to the model, as agents do
                span.record_exception(e)
                span.set_status(Status(StatusCode.ERROR, str(e)))
                return f"Error: {type(e).__name__}: {e}", False
            span.set_attribute("output.value" if self.dialect == "openinference" else "gen_ai.tool.call.result", result)
            return result, True


# (name, replies, agent options, truth: "llm:<k>" the k-th model call, "tool:<k>" the k-th tool call, None)
_PARAMGEN: list[tuple[str, list[tuple[int, dict[str, Any]]], dict[str, bool], str | None]] = [
    ("unknown-field", [_reply(None, [_call("c1", "lookup_weather", {"town": "Paris"})]),
                       _reply("Sorry, I could not get the weather.")], {}, "llm:0"),
    ("missing-field", [_reply(None, [_call("c1", "lookup_weather", {})])], {"raise_on_error": True}, "llm:0"),
    ("not-json", [_reply(None, [_call("c1", "lookup_weather", "{city: Paris")]),
                  _reply("Sorry, I could not get the weather.")], {}, "llm:0"),
    ("one-of-two", [_reply(None, [_call("c1", "lookup_weather", {"city": "Paris"}),
                                  _call("c2", "lookup_weather", {"city": "Lyon", "unit": "C"})]),
                    _reply("Paris is sunny; Lyon I could not check.")], {}, "llm:0"),
    ("guardrail-between", [_reply(None, [_call("c1", "lookup_weather", {"town": "Paris"})]), _reply("allowed"),
                           _reply("Sorry, I could not get the weather.")], {"guardrail": True}, "llm:0"),
    ("recovered", [_reply(None, [_call("c1", "lookup_weather", {"town": "Paris"})]),
                   _reply(None, [_call("c2", "lookup_weather", {"city": "Paris"})]),
                   _reply("It is 21C and sunny in Paris.")], {}, None),
    ("control-tool-fault", [_reply(None, [_call("c1", "lookup_weather", {"city": "Atlantis"})]),
                            _reply("Sorry, the weather service is down.")], {}, "tool:0"),
]


def _truth(spec: str | None, agent: Agent) -> str | None:
    if spec is None:
        return None
    kind, k = spec.split(":")
    return (agent.llm_spans if kind == "llm" else agent.tool_spans)[int(k)]


def _encode(spans: list[Any]) -> bytes:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    data: bytes = encode_spans(spans).SerializeToString()
    return data


def paramgen_cases(dialects: tuple[str, ...] = DIALECTS) -> list[Case]:
    """Class 2: one conversation per (scenario, dialect)."""
    cases = []
    for dialect in dialects:
        for name, replies, options, truth in _PARAMGEN:
            with fake_openai_server(replies) as srv, _instrumented(dialect) as (provider, exporter):
                agent = Agent(dialect, srv.base_url, provider.get_tracer("weather-app"), exporter,
                              {"lookup_weather": lookup_weather}, **options)
                with suppress(RuntimeError):  # the agent that gives up raises
                    agent.run("What's the weather?", f"conv-{name}-{dialect}")
                cases.append(Case(name, dialect, [_encode(list(exporter.get_finished_spans()))],
                                  _truth(truth, agent), made_up=(truth or "").startswith("llm")))
    return cases


# ---- class 5: a remote tool on another clock --------------------------------------------------------

SKEWS_MS = (-450.0, -300.0, -150.0, 150.0, 300.0, 450.0)
# (name, city the model asks for, truth) -- a blank city is rejected by the remote tool (422)
_REMOTE = [("remote-ok", "Paris", None), ("remote-backend-down", "Atlantis", "remote"),
           ("remote-rejects-arguments", "", "llm:0")]


@contextmanager
def remote_tool(skew_ms: float, out: Path) -> Iterator[str]:
    """Run ``tests.remote_tool_server`` in a second process writing its spans to ``out``; yield its
    base url. The process has exported everything when the block ends."""
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in [str(root), os.environ.get("PYTHONPATH", "")] if p)}
    proc = subprocess.Popen([sys.executable, "-m", "tests.remote_tool_server", "--skew-ms", str(skew_ms),
                             "--out", str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            cwd=root, env=env)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        yield f"http://127.0.0.1:{port}"
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)


def read_requests(path: Path) -> list[bytes]:
    """The OTLP requests the remote service appended to ``path``."""
    data = path.read_bytes() if path.exists() else b""
    out, at = [], 0
    while at < len(data):
        (n,) = struct.unpack(">I", data[at:at + 4])
        out.append(data[at + 4:at + 4 + n])
        at += 4 + n
    return out


def skew_cases(skews: tuple[float, ...] = SKEWS_MS) -> list[Case]:
    """Class 5: per clock skew of the remote service, a healthy call, a backend fault and rejected arguments."""
    cases: list[Case] = []
    for skew in skews:
        with tempfile.TemporaryDirectory() as tmp:
            spans_file = Path(tmp) / "spans.bin"
            with remote_tool(skew, spans_file) as url:
                found = [_remote_case(url, skew, name, city, truth) for name, city, truth in _REMOTE]
            _attach_remote(found, read_requests(spans_file))
        cases += found
    return cases


def _remote_case(url: str, skew: float, name: str, city: str, truth: str | None) -> Case:
    """One conversation whose tool calls the remote service over HTTP (httpx, traced)."""
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

    replies = [_reply(None, [_call("c1", "get_forecast", {"city": city})]), _reply("Here is what I found.")]
    with http_client(base_url=url, timeout=10) as http:

        def get_forecast(city: str) -> str:
            response = http.get("/forecast", params={"city": city})
            response.raise_for_status()
            return response.text

        with fake_openai_server(replies) as srv, _instrumented("openai-v2") as (provider, exporter):
            HTTPXClientInstrumentor.instrument_client(http, tracer_provider=provider)
            agent = Agent("openai-v2", srv.base_url, provider.get_tracer("weather-app"), exporter,
                          {"get_forecast": get_forecast})
            agent.run("Forecast please", f"conv-{name}-{skew:+.0f}")
            local = list(exporter.get_finished_spans())
    root = None if truth is None else ("remote" if truth == "remote" else _truth(truth, agent))
    clients = [(_hex(s), "") for s in local if s.kind.name == "CLIENT" and s.name.startswith("GET")]
    return Case(f"{name} skew {skew:+.0f} ms", "openai-v2+httpx+wsgi", [_encode(local)], root, clients,
                made_up=(truth or "").startswith("llm"))


def _attach_remote(cases: list[Case], requests: list[bytes]) -> None:
    """Give each case the remote spans of its trace, the server span of each call and, for a backend
    fault, the remote tool span as the truth."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    server_of: dict[str, str] = {}  # client span -> server span
    tool_of: dict[str, str] = {}  # server span -> remote tool span
    bodies: dict[str, list[bytes]] = {}  # parent (client) span of a server span -> the trace's remote bodies
    trace_bodies: dict[bytes, list[bytes]] = {}
    for body in requests:
        for rs in ExportTraceServiceRequest.FromString(body).resource_spans:
            for s in (s for ss in rs.scope_spans for s in ss.spans):
                trace_bodies.setdefault(s.trace_id, []).append(body)
                if s.kind == 2:  # SERVER
                    server_of[s.parent_span_id.hex()] = s.span_id.hex()
                    bodies[s.parent_span_id.hex()] = trace_bodies[s.trace_id]
                elif s.name.startswith("execute_tool"):
                    tool_of[s.parent_span_id.hex()] = s.span_id.hex()
    for case in cases:
        case.remote_calls = [(client, server_of[client]) for client, _ in case.remote_calls]
        for client, server in case.remote_calls:
            case.requests += list(dict.fromkeys(bodies[client]))
            if case.root_span_id == "remote":
                case.root_span_id = tool_of[server]


# ---- the pipeline on a case --------------------------------------------------------------------------


@dataclass
class Outcome:
    """What tracedag made of one case."""

    root_span_id: str | None  # greedy root cause of the trace (None: not a failed trace)
    order_right: int  # remote calls whose server span starts inside its client span (request before handling)
    calls: int


def load_case(cases: list[Case], data: Path) -> None:
    """Convert the cases' OTLP requests into the spans of a fresh store at ``data`` and build it."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from tracedag.pipeline.convert.reference import requests_to_table
    from tracedag.pipeline.dag import build_store
    from tracedag.pipeline.store.parquet import write_parquet_atomic
    from tracedag.schemas.layout import table_dir

    parsed = [ExportTraceServiceRequest.FromString(body) for case in cases for body in case.requests]
    table = requests_to_table([(req, 1 + i, f"b{i}") for i, req in enumerate(parsed)])
    write_parquet_atomic(table, table_dir(data, "spans"))
    build_store(data, idle_seconds=0)


def analyse(case: Case, data: Path) -> Outcome:
    """Ingest, build, score and ask ``root_causes`` about one case, in a fresh store at ``data``."""
    return analyse_together([case], data)[0]


def analyse_together(cases: list[Case], data: Path) -> list[Outcome]:
    """``analyse`` of each case, the cases in ONE fresh store at ``data`` (one build and one scoring for all).

    Root causes are one row per failed trace, so a case's answer is the first ``root_causes`` row of its own
    traces: the row ``analyse`` reads from a store of that case alone, unless one conversation's analysis
    leaked into another's (which this then shows as a wrong answer too)."""
    from tracedag.pipeline.score import score_store
    from tracedag.pipeline.store.querying import run_named
    from tracedag.pipeline.store.views import connect

    load_case(cases, data)
    score_store(data)
    roots = run_named(data, "root_causes").to_pylist()
    con = connect(data, shared_macros=False)  # views only, no query macro
    try:
        times = {r[0]: (r[1], r[2]) for r in con.execute(
            "select span_id, start_time_unix_nano, end_time_unix_nano from dag_nodes").fetchall()}
    finally:
        con.close()
    out = []
    for case in cases:
        mine = [r for r in roots if r["trace_id"] in trace_ids(case)]
        right = sum(1 for c, s in case.remote_calls if times[c][0] <= times[s][0] <= times[c][1])
        out.append(Outcome(mine[0]["root_span_id"] if mine else None, right, len(case.remote_calls)))
    return out


def trace_ids(case: Case) -> set[str]:
    """The ids (hex) of the traces in the case's OTLP requests."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    found = set()
    for body in case.requests:
        for resource in ExportTraceServiceRequest.FromString(body).resource_spans:
            for scope in resource.scope_spans:
                found.update(span.trace_id.hex() for span in scope.spans)
    return found


def llm_flagged(data: Path, case: Case) -> bool:
    """Whether the true root cause, a model step that made arguments up, fails as ``invalid_tool_arguments``."""
    from tracedag.pipeline.store.views import connect

    if not case.made_up:
        return False
    con = connect(data, shared_macros=False)  # views only, no query macro
    try:
        found = con.execute("select count(*) from step_scores where span_id = $s and taxonomy_l3 = 'invalid_tool_arguments'",
                            {"s": case.root_span_id}).fetchone()
    finally:
        con.close()
    return bool(found and found[0])
