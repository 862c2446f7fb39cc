"""Which stored conversations a replay reads, and their user turns, from real instrumentation's spans."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.dag.spanbuild import q
from tests.queries.rca_scenarios import ACROSS_TURNS, capture
from tests.realspans import langgraph_spans, to_table
from tests.replay.replay_support import BOOKING_TURNS, INFO_TURNS, example_store
from tracedag.pipeline.replay.source import ReplaySourceError, Selection, parse_since, select_conversations
from tracedag.pipeline.store.parquet import write_parquet_atomic
from tracedag.schemas.layout import table_dir


def _store(tmp_path, table):
    data = tmp_path / "data"
    write_parquet_atomic(table, table_dir(data, "spans"))
    return data


def test_genai_one_trace_per_turn_with_history(tmp_path):
    """openai-v2 spans (gen_ai.input.messages carry the whole history): the turns in order, once each."""
    three = next(s for s in ACROSS_TURNS if s.name == "x3-three-turns")
    data = _store(tmp_path, capture([three]))
    [conv] = select_conversations(data, Selection())
    assert conv.conversation_id == three.conversation_id
    assert conv.turns == tuple(t.user for t in three.turns)
    assert q(data, "select count(distinct trace_id) from spans")[0][0] == 3  # one trace per turn


@pytest.mark.parametrize("dialect", ["openinference", "openllmetry"])
def test_langgraph_dialects(tmp_path, dialect):
    """OpenInference (llm.input_messages.*) and OpenLLMetry (gen_ai.prompt.N.*) LangGraph runs."""
    cap = langgraph_spans(dialect=dialect)
    data = _store(tmp_path, to_table(cap.spans))
    [conv] = select_conversations(data, Selection())
    assert conv.conversation_id == cap.thread_id
    assert conv.turns == ("What's the weather in Paris?",)


def test_example_agent_turns_come_from_user_message_events(tmp_path):
    """One trace per conversation: the agent records each turn it reads (internal prompts are not turns)."""
    data = example_store(tmp_path / "data", {"c-book": BOOKING_TURNS, "c-info": INFO_TURNS})
    got = {c.conversation_id: c.turns for c in select_conversations(data, Selection())}
    assert got == {"c-book": BOOKING_TURNS, "c-info": INFO_TURNS}
    assert q(data, "select count(distinct trace_id) from spans where conversation_id = 'c-book'")[0][0] == 1


def _plain_spans(tmp_path, specs):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    for conversation, failed in specs:
        attrs = {"gen_ai.conversation.id": conversation, "gen_ai.operation.name": "invoke_agent",
                 "gen_ai.input.messages": '[{"role":"user","parts":[{"type":"text","content":"hi ' + conversation + '"}]}]'}
        with tracer.start_as_current_span("invoke_agent a", attributes=attrs) as span:
            if failed:
                from opentelemetry.trace import Status, StatusCode

                span.set_status(Status(StatusCode.ERROR, "boom"))
    with tracer.start_as_current_span("silent", attributes={"gen_ai.conversation.id": "mute"}):
        pass
    provider.shutdown()
    return _store(tmp_path, to_table(exporter.get_finished_spans()))


def test_selection_filters_and_errors(tmp_path):
    data = _plain_spans(tmp_path, [("a", False), ("b", True), ("c", False)])
    ids = lambda sel: [c.conversation_id for c in select_conversations(data, sel)]  # noqa: E731
    assert ids(Selection(conversations=("c", "a"))) == ["a", "c"]
    assert ids(Selection(conversations=("b",), failed_only=True)) == ["b"]
    assert ids(Selection(where="conversation_id in ('a', 'b') and not failed")) == ["a"]
    assert ids(Selection(conversations=("a",), since_seconds=parse_since("1h"))) == ["a"]
    with pytest.raises(ReplaySourceError, match="conversation nope: not found"):
        select_conversations(data, Selection(conversations=("a", "nope")))
    with pytest.raises(ReplaySourceError, match="conversation mute: no user turns"):
        select_conversations(data, Selection())  # every conversation, and 'mute' has no input at all
    with pytest.raises(ReplaySourceError, match="no stored conversation matches"):
        select_conversations(data, Selection(where="traces > 5"))
    with pytest.raises(ReplaySourceError, match="--where 'no_such_column'"):
        select_conversations(data, Selection(where="no_such_column"))
    with pytest.raises(ReplaySourceError, match="--since"):
        parse_since("yesterday")


def test_replays_are_not_sources_unless_named(tmp_path):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    attrs = {"gen_ai.conversation.id": "r1", "tracedag.replay_id": "replay-1",
             "gen_ai.input.messages": '[{"role":"user","parts":[{"type":"text","content":"hi"}]}]'}
    with provider.get_tracer("t").start_as_current_span("invoke_agent a", attributes=attrs):
        pass
    provider.shutdown()
    data = _store(tmp_path, to_table(exporter.get_finished_spans()))
    with pytest.raises(ReplaySourceError, match="no stored conversation"):
        select_conversations(data, Selection())
    assert [c.turns for c in select_conversations(data, Selection(conversations=("r1",)))] == [("hi",)]
