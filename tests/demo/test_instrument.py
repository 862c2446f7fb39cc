"""tracedag.instrument on the real OTel SDK: attributes, labels, errors, composition."""

from __future__ import annotations

import json

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from tracedag import instrument as td


@pytest.fixture()
def exporter():
    exp = InMemorySpanExporter()
    td.configure(service_name="unit", service_version="9.9", exporter=exp, set_global=False)
    yield exp
    td.shutdown()


def _spans(exp):
    td.force_flush()
    return {s.name: s for s in exp.get_finished_spans()}


def test_genai_attributes_on_each_step(exporter):
    @td.tool("lookup", description="finds things")
    def lookup(query: str, limit: int = 3) -> dict:
        return {"hits": [query] * limit}

    with td.conversation("conv-1"), td.agent("helper", version="2"), td.node("answer"):
        with td.llm("m-1", provider="openai", input_messages=["hi there"]) as step:
            step.set_output("hello", finish_reason="stop")
            step.set_usage(11, 3)
        lookup("tennis", limit=2)

    spans = _spans(exporter)
    assert set(spans) == {"invoke_agent helper", "invoke_node answer", "chat m-1", "execute_tool lookup"}
    chat = spans["chat m-1"].attributes
    assert chat["gen_ai.operation.name"] == "chat"
    assert chat["gen_ai.request.model"] == "m-1"
    assert chat["gen_ai.provider.name"] == "openai"
    assert chat["gen_ai.usage.input_tokens"] == 11 and chat["gen_ai.usage.output_tokens"] == 3
    assert tuple(chat["gen_ai.response.finish_reasons"]) == ("stop",)
    assert json.loads(chat["gen_ai.input.messages"])[0]["parts"][0]["content"] == "hi there"
    assert json.loads(chat["gen_ai.output.messages"])[0]["role"] == "assistant"
    tool = spans["execute_tool lookup"].attributes
    assert tool["gen_ai.tool.name"] == "lookup"
    assert json.loads(tool["gen_ai.tool.call.arguments"]) == {"query": "tennis", "limit": 2}
    assert json.loads(tool["gen_ai.tool.call.result"]) == {"hits": ["tennis", "tennis"]}
    node = spans["invoke_node answer"].attributes
    assert node["gen_ai.operation.name"] == "invoke_node" and node["gen_ai.node.name"] == "answer"
    agent = spans["invoke_agent helper"].attributes
    assert agent["gen_ai.agent.name"] == "helper" and agent["gen_ai.agent.version"] == "2"
    assert all(s.attributes["gen_ai.conversation.id"] == "conv-1" for s in spans.values())
    assert spans["chat m-1"].resource.attributes["service.version"] == "9.9"


def test_run_labels_reach_every_span_and_nodes_are_chained(exporter):
    labels = td.run_labels(run_id="r1", scenario_id="s1", replay_index=2, variant_id="v1", intended_path=["a", "b"])
    with labels, td.agent("ag"):
        with td.node("a"):
            pass
        with td.node("b"):
            pass
    spans = _spans(exporter)
    for span in spans.values():
        assert span.attributes["tracedag.run_id"] == "r1"
        assert span.attributes["tracedag.scenario_id"] == "s1"
        assert span.attributes["tracedag.replay_index"] == 2
        assert span.attributes["tracedag.variant_id"] == "v1"
        assert json.loads(span.attributes["tracedag.intended_path"]) == ["a", "b"]
    a, b = spans["invoke_node a"].attributes, spans["invoke_node b"].attributes
    assert "gen_ai.node.previous_execution.id" not in a
    assert tuple(b["gen_ai.node.previous_execution.id"]) == (a["gen_ai.node.execution.id"],)


def test_exception_sets_error_status_type_and_event(exporter):
    class Upstream503(Exception):
        pass

    with pytest.raises(Upstream503), td.tool("calendar", call_id="c1"):
        raise Upstream503("HTTP 503")
    span = _spans(exporter)["execute_tool calendar"]
    assert span.status.status_code == StatusCode.ERROR
    assert "HTTP 503" in span.status.description
    assert span.attributes["error.type"].endswith("Upstream503")
    assert span.attributes["gen_ai.tool.call.id"] == "c1"
    assert [e.name for e in span.events] == ["exception"]


def test_decorated_function_failure_propagates(exporter):
    @td.tool("divide")
    def divide(a: int, b: int) -> float:
        return a / b

    with pytest.raises(ZeroDivisionError):
        divide(1, 0)
    span = _spans(exporter)["execute_tool divide"]
    assert span.attributes["error.type"] == "ZeroDivisionError"
    assert "gen_ai.tool.call.result" not in span.attributes


def test_annotating_a_foreign_span_never_overwrites(exporter):
    tracer = td.tracer()
    with tracer.start_as_current_span("framework span", attributes={"gen_ai.operation.name": "chat"}) as span:
        span.set_attribute("gen_ai.request.model", "their-model")
        with td.llm("our-model", provider="p", new_span=False) as step:
            step.set_usage(5, 6)
        with td.run_labels(scenario_id="late"):
            pass
    got = _spans(exporter)["framework span"].attributes
    assert got["gen_ai.request.model"] == "their-model"
    assert got["gen_ai.provider.name"] == "p"
    assert got["gen_ai.usage.input_tokens"] == 5
    assert got["tracedag.scenario_id"] == "late"
    assert len(exporter.get_finished_spans()) == 1


def test_labels_compose_with_openinference_langchain():
    """OpenInference's own spans get the run labels; their attributes stay theirs."""
    from langchain_core.runnables import RunnableLambda
    from openinference.instrumentation.langchain import LangChainInstrumentor

    exp = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(td.LabelSpanProcessor())
    provider.add_span_processor(SimpleSpanProcessor(exp))
    instrumentor = LangChainInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        chain = RunnableLambda(lambda x: x + 1).with_config(run_name="incr")
        with td.conversation("oi-conv"), td.run_labels(scenario_id="oi", replay_index=0):
            assert chain.invoke(1, config={"metadata": {"session_id": "their-session"}}) == 2
    finally:
        instrumentor.uninstrument()
    (span,) = exp.get_finished_spans()
    assert span.attributes["openinference.span.kind"] == "CHAIN"
    assert span.attributes["session.id"] == "their-session"
    assert span.attributes["tracedag.scenario_id"] == "oi"
    assert span.attributes["gen_ai.conversation.id"] == "oi-conv"


def test_resolve_endpoint_appends_traces_path(monkeypatch):
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    assert td.resolve_endpoint("http://h:1", "http/protobuf") == "http://h:1/v1/traces"
    assert td.resolve_endpoint("http://h:1/v1/traces", "http/protobuf") == "http://h:1/v1/traces"
    assert td.resolve_endpoint(None, "grpc") == "127.0.0.1:4317"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:9")
    assert td.resolve_endpoint(None, "http/protobuf") == "http://env:9/v1/traces"


def test_async_tool_and_shared_spec_across_threads(exporter):
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    @td.tool("fetch")
    async def fetch(url: str) -> str:
        await asyncio.sleep(0.001)
        return f"body of {url}"

    assert asyncio.run(fetch("http://x")) == "body of http://x"
    shared = td.node("worker")

    def work(i: int) -> int:
        with shared as step:
            step.set("app.index", i)
            return i

    with ThreadPoolExecutor(4) as pool:
        assert sorted(pool.map(work, range(16))) == list(range(16))
    spans = exporter.get_finished_spans() if td.force_flush() else []
    fetched = [s for s in spans if s.name == "execute_tool fetch"]
    assert len(fetched) == 1 and fetched[0].attributes["gen_ai.tool.call.result"] == "body of http://x"
    assert fetched[0].end_time - fetched[0].start_time >= 1_000_000  # the span covers the awaited body
    workers = [s for s in spans if s.name == "invoke_node worker"]
    assert sorted(s.attributes["app.index"] for s in workers) == list(range(16))


def test_service_name_from_argument_then_environment(monkeypatch):
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    first, second = InMemorySpanExporter(), InMemorySpanExporter()
    try:
        td.configure(exporter=first, set_global=False)
        with td.agent("a"):
            pass
        # configuring again flushes the first provider: its span is exported, not lost
        td.configure(service_name="explicit", exporter=second, set_global=False)
        assert [s.resource.attributes["service.name"] for s in first.get_finished_spans()] == ["from-env"]
        with td.agent("b"):
            pass
        td.force_flush()
        assert [s.resource.attributes["service.name"] for s in second.get_finished_spans()] == ["explicit"]
    finally:
        td.shutdown()


def test_conversation_and_run_labels_work_as_decorators(exporter):
    @td.conversation("conv-deco")
    @td.run_labels(scenario_id="deco", replay_index=1)
    @td.agent("decorated")
    def handle(message: str) -> str:
        return message.upper()

    assert handle("a") == "A" and handle("b") == "B"
    spans = [s for s in exporter.get_finished_spans() if s.name == "invoke_agent decorated"] if td.force_flush() else []
    assert len(spans) == 2
    for span in spans:
        assert span.attributes["gen_ai.conversation.id"] == "conv-deco"
        assert span.attributes["tracedag.scenario_id"] == "deco"
        assert span.attributes["tracedag.replay_index"] == 1


def test_nested_labels_add_up_and_the_innermost_value_wins_with_a_warning(exporter, caplog):
    tracer = td.tracer()
    with caplog.at_level("WARNING", logger="tracedag.instrument.labels"), \
            td.run_labels(scenario_id="s", run_id="outer"), tracer.start_as_current_span("outer span"):
        with td.run_labels(replay_index=3), tracer.start_as_current_span("added"):
            pass
        with td.run_labels(run_id="inner"), tracer.start_as_current_span("replaced"):
            pass
        with tracer.start_as_current_span("after"):
            pass
    spans = _spans(exporter)
    added, replaced, after = (spans[n].attributes for n in ("added", "replaced", "after"))
    assert (added["tracedag.run_id"], added["tracedag.scenario_id"], added["tracedag.replay_index"]) == ("outer", "s", 3)
    assert (replaced["tracedag.run_id"], replaced["tracedag.scenario_id"]) == ("inner", "s")
    assert after["tracedag.run_id"] == "outer" and "tracedag.replay_index" not in after
    assert spans["outer span"].attributes["tracedag.run_id"] == "outer"  # a started span keeps its value
    warnings = [r.getMessage() for r in caplog.records if "nested labels" in r.getMessage()]
    assert warnings == ["nested labels: tracedag.run_id='inner' inside a block with tracedag.run_id='outer'; "
                        "the inner value applies to the spans started inside it"]
