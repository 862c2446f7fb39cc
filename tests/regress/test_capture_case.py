"""``tracedag capture``: the state before a step, from a built store, worked out by hand."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tests.analysis.analysis_support import Store
from tracedag.pipeline.cli import cli
from tracedag.pipeline.dag import build_store
from tracedag.pipeline.regress import RegressError
from tracedag.pipeline.regress.capture import capture_case
from tracedag.testing import load_case

T1, T2, OTHER = "a" * 32, "b" * 32, "c" * 32


def _msgs(*pairs):
    return json.dumps([{"role": r, "parts": [{"type": "text", "content": c}]} for r, c in pairs])


@pytest.fixture
def conv_store(tmp_path):
    """Conversation c1: turn 1 (T1) greets; turn 2 (T2) asks, searches the calendar, then the
    reply step (the one captured). OTHER is another conversation, never part of the state."""
    s = Store(tmp_path / "data")
    conv = {"conversation_id": "c1", "scenario_id": "book", "replay_index": 0}
    r1 = s.span(T1, None, "invoke_agent bot", "agent", start=100, end=200, **conv)
    s.span(T1, r1, "chat m", "llm", start=110, end=150, model="m",
           attributes={"gen_ai.input.messages": _msgs(("user", "hi")),
                       "gen_ai.output.messages": _msgs(("assistant", "hello, how can I help?"))}, **conv)
    r2 = s.span(T2, None, "invoke_agent bot", "agent", start=1000, end=2000, **conv)
    s.span(T2, r2, "chat m", "llm", start=1010, end=1100, model="m",
           attributes={"gen_ai.input.messages": _msgs(("user", "hi"), ("assistant", "hello, how can I help?"),
                                                      ("user", "book saturday")),
                       "gen_ai.output.messages": _msgs(("assistant", "checking saturday"))}, **conv)
    s.span(T2, r2, "execute_tool calendar", "tool", start=1110, end=1200, tool_name="calendar",
           step_name="calendar", status_code=2, error_type="Timeout",
           attributes={"gen_ai.tool.call.arguments": '{"day": "saturday"}', "gen_ai.tool.call.id": "call_1"},
           **conv)
    target = s.span(T2, r2, "chat m", "llm", start=1300, end=1400, model="m", output_text="sorry",
                    attributes={"gen_ai.input.messages": _msgs(("user", "book saturday"), ("tool", "timeout"))},
                    **conv)
    s.span(T2, r2, "execute_tool notify", "tool", start=1500, end=1600, tool_name="notify", **conv)  # after
    s.span(OTHER, None, "invoke_agent bot", "agent", start=50, end=60, conversation_id="c2")
    s.write()
    build_store(s.data, idle_seconds=0)
    return s.data, target


def test_state_before_the_step(conv_store):
    data, target = conv_store
    case = capture_case(data, T2, target)
    assert case["format"] == "tracedag.case/v1"
    assert case["source"]["labels"] == {"service_name": "svc", "scenario_id": "book", "replay_index": 0}
    kinds = [(h["kind"], h.get("role"), h.get("content") or h.get("name")) for h in case["history"]]
    assert kinds == [
        ("message", "user", "hi"),
        ("message", "assistant", "hello, how can I help?"),
        ("message", "user", "book saturday"),  # the resent history is not repeated
        ("message", "assistant", "checking saturday"),
        ("tool_call", None, "calendar"),
    ]
    call = case["history"][-1]
    assert call["arguments"] == {"day": "saturday"} and call["status"] == "error" and call["error_type"] == "Timeout"
    step = case["step"]
    assert (step["type"], step["model"]) == ("llm", "m")
    assert step["input"] == [{"role": "user", "content": "book saturday"}, {"role": "tool", "content": "timeout"}]
    assert step["expected"]["output"] == [{"role": "assistant", "content": "sorry"}]


def test_cli_writes_a_case_the_testing_api_loads(conv_store, tmp_path):
    data, target = conv_store
    out = tmp_path / "cases" / "reply.json"
    r = CliRunner().invoke(cli, ["capture", T2, "--before", target, "--out", str(out), "--data", str(data)])
    assert r.exit_code == 0, r.output
    assert "5 history items before llm step" in r.output
    case = load_case(out)
    assert case.messages[-1] == {"role": "assistant", "content": "checking saturday"}
    assert case.tool_result("calendar") is None and case.tool_calls[0]["call_id"] == "call_1"
    assert case.id == f"{T2}:{target}"


def test_unknown_span_or_bad_id(conv_store):
    data, _ = conv_store
    with pytest.raises(RegressError, match="no span 00000000000000ff in trace"):
        capture_case(data, T2, "00000000000000ff")
    with pytest.raises(RegressError, match="is not a 16-digit hex id"):
        capture_case(data, T2, "x'; drop")
