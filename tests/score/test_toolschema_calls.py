"""The tool calls a model step emitted, read from REAL spans in each dialect that records them, and checked
against the tool schema the trace carries (``score.rules.toolschema``, issue #30 class 3)."""

from __future__ import annotations

import pytest

from tests.rca_agents import paramgen_cases


@pytest.fixture(scope="module")
def spans():
    """Dialect -> the normalized rows of its ``missing-field`` conversation (the model calls
    lookup_weather with ``{}``; the tool wants a city)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from tracedag.pipeline.convert.reference import requests_to_table

    out = {}
    for c in paramgen_cases():
        if c.name == "missing-field":
            reqs = [(ExportTraceServiceRequest.FromString(r), 1, "b1") for r in c.requests]
            out[c.dialect] = requests_to_table(reqs).to_pylist()
    return out


def _first_llm(rows):
    return min((r for r in rows if r["step_type"] == "llm"), key=lambda r: r["start_time_unix_nano"])


def test_the_calls_in_a_model_step_s_output_are_read_in_each_dialect(spans):
    from tracedag.pipeline.score.rules.toolschema import EmittedCall, emitted_calls

    got = {d: emitted_calls(_first_llm(rows)["attributes"]) for d, rows in spans.items()}
    # openai-v2 writes gen_ai.output.messages (arguments as an object), OpenInference
    # llm.output_messages.*.tool_calls.*; without captured content there is nothing to read
    assert got == {"openai-v2": [EmittedCall("lookup_weather", "{}", "c1")],
                   "openinference": [EmittedCall("lookup_weather", "{}", "c1")],
                   "openai-v2-no-content": []}


def test_an_emitted_call_is_checked_against_the_schema_the_model_was_given(spans):
    from tracedag.pipeline.score.rules.toolschema import call_problem, emitted_calls, span_definitions

    llm = _first_llm(spans["openinference"])
    given, own = span_definitions(llm["attributes"])
    assert set(given) == {"lookup_weather"} and own == {}
    [call] = emitted_calls(llm["attributes"])
    problem = call_problem(call, given["lookup_weather"])
    assert problem is not None and (problem.kind, problem.detail) == ("schema", "(root): 'city' is a required property")
    fixed = call_problem(type(call)(call.name, '{"city": "Paris"}', call.call_id), given["lookup_weather"])
    assert fixed is None
    broken = call_problem(type(call)(call.name, '{"city": ', call.call_id), given["lookup_weather"])
    assert broken is not None and broken.kind == "not_json"
