"""Normalization of spans captured from the real instrumentation libraries (no network).

Each test reads the columns a person would read off the agent's own code: which node, which
tool, which conversation, how many tokens, what went in and out.
"""

import json

import pytest

from tests.realspans import TOPICS, genai_plain_spans, langgraph_spans, openai_spans, to_table

NODE_NAMES = {"classify", "smalltalk", "agent", "tools", "write_section", "validator", "fixer"}


def _rows(table):
    rows = table.to_pylist()
    for r in rows:
        r["attrs"] = dict(r["attributes"])
    return sorted(rows, key=lambda r: r["start_time_unix_nano"])


@pytest.fixture(scope="module")
def oi_capture():
    return langgraph_spans()


@pytest.fixture(scope="module")
def oi_rows(oi_capture):
    return _rows(to_table(oi_capture.spans))


@pytest.fixture(scope="module")
def ol_capture():
    return langgraph_spans(dialect="openllmetry")


@pytest.fixture(scope="module")
def ol_rows(ol_capture):
    return _rows(to_table(ol_capture.spans))


def _node_spans(rows):
    return [r for r in rows if r["node_execution_id"] is not None]


@pytest.mark.parametrize("dialect", ["oi", "ol"])
def test_langgraph_nodes_match_langgraphs_own_steps(dialect, request):
    cap = request.getfixturevalue(f"{dialect}_capture")
    rows = request.getfixturevalue(f"{dialect}_rows")
    nodes = _node_spans(rows)
    truth = {
        s["task_id"]: (s["step"], s["node"], json.dumps(s["triggers"], separators=(",", ":")))
        for s in cap.steps
    }
    got = {
        r["node_execution_id"]: (r["langgraph_step"], r["step_name"], r["langgraph_triggers"]) for r in nodes
    }
    assert got == truth
    assert all(r["step_type"] == "chain" for r in nodes)
    assert {r["step_name"] for r in nodes} <= NODE_NAMES
    assert [r["step_name"] for r in nodes].count("write_section") == len(TOPICS)


@pytest.mark.parametrize("dialect", ["oi", "ol"])
def test_langgraph_tool_llm_and_conversation(dialect, request):
    rows = request.getfixturevalue(f"{dialect}_rows")
    tools = [r for r in rows if r["step_type"] == "tool"]
    assert [(t["step_name"], t["tool_name"], t["langgraph_node"]) for t in tools] == [
        ("lookup_weather", "lookup_weather", "tools")
    ]
    assert tools[0]["output_text"] == "Paris: 21C and sunny"
    assert "Paris" in tools[0]["input_text"]
    llm = [r for r in rows if r["step_type"] == "llm" and r["langgraph_node"] == "agent"]
    assert [(r["input_tokens"], r["output_tokens"]) for r in llm] == [(31, 12), (58, 9)]
    assert llm[0]["output_text"] == 'lookup_weather({"city": "Paris"})'
    assert llm[1]["output_text"] == "Paris is 21C and sunny; writing the report."
    assert llm[0]["input_text"] == "What's the weather in Paris?"
    assert {r["conversation_id"] for r in rows} == {"conv-42"}
    assert {
        (r["run_id"], r["scenario_id"], r["replay_index"], r["variant_id"], r["service_version"])
        for r in rows
    } == {("run-7", "weather-report", 2, "baseline", "1.4.0")}
    roots = [r for r in rows if r["step_type"] == "agent"]
    assert roots and {r["agent_name"] for r in roots} == {"LangGraph"}


def test_openinference_agent_by_name_quirk_is_corrected(oi_rows):
    typed_agent = [r for r in oi_rows if r["attrs"].get("openinference.span.kind") == "AGENT"]
    # the library typed the node "agent" and the router "route_agent" AGENT only because of their names
    assert {r["name"] for r in typed_agent} == {"agent", "route_agent"}
    assert {r["step_type"] for r in typed_agent} == {"chain"}
    assert {r["step_name"] for r in typed_agent} == {"agent", "route_agent"}
    graph_run = [r for r in oi_rows if r["parent_span_id"] is None]
    assert [(r["name"], r["step_type"]) for r in graph_run] == [("LangGraph", "agent")]


@pytest.fixture(scope="module")
def openai_rows():
    return _rows(to_table(openai_spans(latest=True)))


def test_openai_v2_latest_conventions(openai_rows):
    chats = [r for r in openai_rows if r["step_type"] == "llm"]
    assert [r["step_name"] for r in chats] == ["chat gpt-4o-mini"] * 3
    assert {(r["model"], r["provider"]) for r in chats} == {("gpt-4o-mini", "openai")}
    assert [(r["input_tokens"], r["output_tokens"], r["finish_reason"]) for r in chats] == [
        (42, 17, "tool_calls"),
        (80, 12, "stop"),
        (None, None, None),
    ]
    assert chats[0]["input_text"] == "What's the weather in Paris?"
    assert chats[0]["output_text"] == 'lookup_weather({"city": "Paris"})'
    assert chats[1]["output_text"] == "It is 21C and sunny in Paris."
    # the chat spans carry no conversation id: inherited from their trace's invoke_agent span
    assert {r["conversation_id"] for r in openai_rows} == {"conv-openai-1"}
    tool = next(r for r in openai_rows if r["step_type"] == "tool")
    assert (tool["step_name"], tool["tool_call_id"], tool["output_text"]) == (
        "lookup_weather",
        "call_w1",
        "Paris: 21C and sunny",
    )
    agent = next(r for r in openai_rows if r["step_type"] == "agent")
    assert (agent["step_name"], agent["agent_name"]) == ("weather_assistant", "weather_assistant")


def test_openai_error_type_class_repr_is_normalized(openai_rows):
    failed = [r for r in openai_rows if r["status_code"] == 2]
    assert len(failed) == 1
    assert failed[0]["attrs"]["error.type"] == "<class 'openai.InternalServerError'>"
    assert failed[0]["error_type"] == "openai.InternalServerError"
    assert failed[0]["input_text"] == "again"


def test_openai_v2_default_conventions_without_content():
    rows = _rows(to_table(openai_spans(latest=False)))
    chats = [r for r in rows if r["step_type"] == "llm"]
    assert [(r["input_tokens"], r["output_tokens"]) for r in chats] == [(42, 17), (80, 12), (None, None)]
    assert {r["input_text"] for r in chats} == {None}
    assert chats[2]["error_type"] == "openai.InternalServerError"


@pytest.fixture(scope="module")
def plain_table():
    return to_table(genai_plain_spans())


def test_plain_genai_new_and_old_names(plain_table):
    rows = {r["name"]: r for r in _rows(plain_table)}
    new, old = rows["chat gpt-4o"], rows["openai.chat"]
    assert (new["step_type"], new["model"], new["provider"], new["input_tokens"], new["output_tokens"]) == (
        "llm",
        "gpt-4o",
        "openai",
        120,
        30,
    )
    assert (old["step_type"], old["model"], old["provider"], old["input_tokens"], old["output_tokens"]) == (
        "llm",
        "gpt-3.5-turbo",
        "openai",
        25,
        8,
    )
    assert (new["input_text"], new["output_text"]) == (
        "What time is it in Tokyo?",
        'get_time({"tz": "Asia/Tokyo"})',
    )
    assert (old["input_text"], old["output_text"], old["finish_reason"]) == ("Say hi", "Hi!", "stop")
    assert new["finish_reason"] == "tool_call"
    assert (new["conversation_id"], old["conversation_id"]) == ("conv-new", "conv-old")
    tool = rows["execute_tool get_time"]
    assert (tool["step_type"], tool["tool_name"], tool["error_type"]) == ("tool", "get_time", "TimeoutError")
    unknown = rows["Job 0x7f3a run 12"]
    assert (unknown["step_type"], unknown["step_name"], unknown["conversation_id"]) == (
        "other",
        "Job run",
        "conv-old",
    )
    assert rows["greeting"]["step_type"] == "chain"
    assert rows["evaluate correctness"]["step_type"] == "evaluator"


def test_evaluations_from_events_annotations_and_evaluator_spans(plain_table):
    from tracedag.pipeline.normalize.evaluations import extract_evaluations

    names = dict(zip(plain_table["span_id"].to_pylist(), plain_table["name"].to_pylist(), strict=True))
    got = {
        (
            r["name"],
            names[r["span_id"]],
            names[r["source_span_id"]],
            r["source_kind"],
            r["score_value"],
            r["label"],
        )
        for r in extract_evaluations(plain_table).to_pylist()
    }
    assert got == {
        ("tool_choice", "chat gpt-4o", "chat gpt-4o", "gen_ai.evaluation.result", 0.9, "pass"),
        ("brevity", "openai.chat", "offline eval", "gen_ai.evaluation.result", 5.0, None),
        ("helpfulness", "greeting", "greeting", "openinference.annotation", 4.0, "good"),
        ("toxicity", "greeting", "greeting", "openinference.evaluation", 0.0, "clean"),
        ("correctness", "openai.chat", "evaluate correctness", "openinference.annotation", 1.0, "correct"),
    }
