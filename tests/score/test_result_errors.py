"""Error payloads in tool results (pipeline/score/rules/result_errors.py): each documented shape, its near
misses, and the failing score a tool step carrying one gets from the rules (issue #30 class 2)."""

from __future__ import annotations

import json

import pytest

from tracedag.pipeline.score.rules.result_errors import ADK_REFLECT_RETRY, SHAPES, error_message, result_error
from tracedag.pipeline.score.rules.table import StepFacts, score_step

# Google ADK's ReflectAndRetryToolPlugin answer, as its ToolFailureResponse model serialises it
ADK = {"response_type": ADK_REFLECT_RETRY, "error_type": "ValueError",
       "error_details": "time must be HH:MM, got 'around six'", "retry_count": 1,
       "reflection_guidance": "The call to tool `book_taxi` failed. ..."}

SHAPE_CASES = [
    ("adk_reflect_retry", json.dumps(ADK)),
    ("adk_reflect_retry", json.dumps({"response": ADK})),  # ADK's function response wraps the tool's dict
    ("is_error", json.dumps({"content": [{"type": "text", "text": "no such order"}], "isError": True})),  # MCP
    ("is_error", json.dumps({"type": "tool_result", "tool_use_id": "t1", "is_error": True, "content": "boom"})),
    ("error_key", '{"error": "order B-9 not found"}'),
    ("error_key", '{"errors": [{"field": "city", "message": "required"}]}'),
    ("error_key", '{"exception": "KeyError: B-9"}'),
    ("error_key", '{"result": {"error": "warehouse offline"}}'),
    # LlamaIndex's ToolOutput: the tool's own return value in raw_output
    ("status_error", '{"blocks": [{"text": "..."}], "tool_name": "lookup_order", "raw_output": {"status": "error"}}'),
    ("error_key", '{"status": "error", "error": "order B-9 not found"}'),  # first listed shape that matches
    ("status_error", '{"status": "error", "message": "order B-9 not found"}'),
    ("status_error", '{"status": "FAILED", "detail": "backend down"}'),
    ("status_error", '{"structuredContent": {"status": "failure"}}'),
    ("error_text", "Error: order B-9 not found"),
    ("error_text", "ValueError: time must be HH:MM"),
    ("error_text", "Traceback (most recent call last):\n  File ..."),
]

PASSING = [
    '{"order_id": "A-1001", "status": "shipped"}',
    '{"error": null, "result": "ok"}',
    '{"errors": []}',
    '{"isError": false, "content": [{"type": "text", "text": "done"}]}',
    '{"response_type": "TEXT", "error_type": ""}',
    '[{"id": 1, "error": "row 1 bad"}]',  # a list of records is a result, not an error report
    "no errors found",
    "Lyon: 21C and sunny",
    '{"error": "unterminated',  # not JSON: not read as a payload, and not error text either
    '{"result": [{"error": "x"}]}',  # only objects are read one level down
    "",
]


@pytest.mark.parametrize(("shape", "text"), SHAPE_CASES)
def test_each_documented_shape_is_recognised(shape: str, text: str) -> None:
    assert result_error(text) == shape


def test_every_listed_shape_has_a_case() -> None:
    assert {name for name, _ in SHAPES} | {"error_text"} == {s for s, _ in SHAPE_CASES}


@pytest.mark.parametrize("text", PASSING)
def test_results_that_only_look_like_errors_pass(text: str) -> None:
    assert result_error(text) is None


@pytest.mark.parametrize(("shape", "text"), SHAPE_CASES)
def test_a_tool_step_returning_a_payload_fails_without_an_error_status(shape: str, text: str) -> None:
    rows = score_step(StepFacts("t", "s", step_type="tool", step_name="book_taxi", status_code=1, output_text=text))
    execution = next(r for r in rows if r.metric == "execution")
    assert execution.score == 1.0, (shape, execution)
    assert execution.explanation.startswith("the tool raised or reported an error")


def test_the_adk_payload_carries_its_error_into_the_explanation() -> None:
    rows = score_step(StepFacts("t", "s", step_type="tool", step_name="book_taxi", status_code=0,
                                output_text=json.dumps(ADK)))
    execution = next(r for r in rows if r.metric == "execution")
    assert "time must be HH:MM" in execution.explanation


def test_an_llm_step_is_never_read_for_payloads() -> None:
    rows = score_step(StepFacts("t", "s", step_type="llm", status_code=0, output_text='{"error": "x"}'))
    assert min(r.score for r in rows) == 5.0


# the plugin's reflection guidance as ADK 2.13 writes it (tests/normalize/frameworks/test_fw_google_adk.py captures it)
GUIDANCE = ("The call to tool `get_weather` failed.\n\n**Error Details:**\n```\nTimeoutError: weather backend timed out"
            " after 10s\n```\n\n**Reflection Guidance:**\nThis is retry attempt **1 of 2**. Analyze the error and the"
            " arguments you provided.\n\n1.  **Invalid Parameters**: Does the error suggest that one or more arguments"
            " are incorrect, badly formatted, or missing? Review the tool's schema and your arguments.")
TIMEOUT = {**ADK, "error_type": "TimeoutError", "error_details": "weather backend timed out after 10s",
           "reflection_guidance": GUIDANCE}


@pytest.mark.parametrize("text", [json.dumps(TIMEOUT), json.dumps({"response": TIMEOUT})])
def test_an_adk_payload_says_its_error_type_and_details_only(text: str) -> None:
    assert error_message(text) == "TimeoutError: weather backend timed out after 10s"


@pytest.mark.parametrize("text", ['{"status": "error", "error": "order B-9 not found"}', "Error: boom", "", None])
def test_any_other_result_is_its_own_error_message(text: str | None) -> None:
    assert error_message(text) == (text or "")


def test_the_plugins_guidance_is_not_read_as_rejected_arguments() -> None:
    rows = score_step(StepFacts("t", "s", step_type="tool", step_name="get_weather", status_code=0,
                                output_text=json.dumps(TIMEOUT)))
    failing = {r.metric: (r.category and r.category.l3, r.explanation) for r in rows if r.failed}
    assert set(failing) == {"execution"}
    assert failing["execution"][0] == "timeout"
    assert failing["execution"][1].startswith("the call timed out: TimeoutError: weather backend timed out after 10s")
    assert "Guidance" not in failing["execution"][1]


def test_arguments_the_adk_payload_says_were_rejected_still_are() -> None:
    rows = score_step(StepFacts("t", "s", step_type="tool", step_name="book_taxi", status_code=0,
                                output_text=json.dumps({**ADK, "reflection_guidance": GUIDANCE})))
    assert {r.metric: r.category and r.category.l3 for r in rows if r.failed}["arguments"] == "malformed_arguments"
