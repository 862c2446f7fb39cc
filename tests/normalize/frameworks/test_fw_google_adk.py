"""Root causes on REAL Google ADK runs (ADK's native OpenTelemetry spans), issue #30.

google-adk 2.13 runs from a pinned venv (``google_adk_requirements.txt``) with its ``LiteLlm`` model
against the scripted OpenAI-compatible server on 127.0.0.1, its spans (aligned with the OTel GenAI
conventions, content on spans through ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``) sent
through the global tracer provider by the OTel SDK's OTLP/HTTP exporter to a real ``tracedag
collect``, built and scored by the real pipeline. A tool's exception ends the run, unless ADK's
``ReflectAndRetryToolPlugin`` turns it into the tool's result: a span with no error status whose
result is the plugin's ``ERROR_HANDLED_BY_REFLECT_AND_RETRY_PLUGIN`` payload (issue #30 class 2).
"""

from __future__ import annotations

import json

import pytest

from tests.normalize.frameworks.fw_capture import VENVS, Capture, answered_turns, captured, misses, step_types
from tests.normalize.frameworks.fw_scenarios import ADK_LLM, google_adk_scenarios
from tracedag.pipeline.score.rules.result_errors import ADK_REFLECT_RETRY, result_error
from tracedag.pipeline.store.querying import run_named
from tracedag.pipeline.store.views import connect

SCENARIOS = google_adk_scenarios()
PINNED_VENVS = [VENVS["google-adk"]]  # built in the background from the start of the run (tests.pinned_venv)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Capture:
    return captured("google-adk", SCENARIOS, tmp_path_factory.mktemp("google-adk"))


def tool_spans(run: Capture, conversation: str) -> list[tuple[str, int, str]]:
    """(span id, status code, result text) of the conversation's tool steps, in start order."""
    con = connect(run.data)
    try:
        rows = con.execute("select span_id, status_code, output_text from spans where conversation_id = ? "
                           "and step_type = 'tool' order by start_time_unix_nano", [conversation]).fetchall()
    finally:
        con.close()
    return [(str(sid), int(code), str(out or "")) for sid, code, out in rows]


def test_the_framework_ran_every_scripted_turn(run: Capture) -> None:
    lines = answered_turns(run)
    assert len(lines) == sum(len(s.turns) for s in SCENARIOS)
    assert lines[0].endswith('"answer": "TimeoutError: weather backend timed out after 10s"}')
    assert '"answer": "Lyon: 21C and sunny"' in lines[3]


def test_one_llm_step_per_model_call(run: Capture) -> None:
    kinds, llm_calls = step_types(run.data)
    assert kinds[ADK_LLM] == "llm"
    assert kinds["execute_tool get_weather"] == "tool"
    assert kinds["invoke_agent assistant"] == "agent"
    assert llm_calls == len(run.model_requests)


def test_the_plugin_failure_lives_in_the_result_and_fails_the_tool(run: Capture) -> None:
    (sid, code, result), = tool_spans(run, "adk-apology")
    payload = json.loads(result)
    assert code != 2 and payload["response_type"] == ADK_REFLECT_RETRY
    assert (payload["error_type"], payload["error_details"]) == ("TimeoutError", "weather backend timed out after 10s")
    assert result_error(result) == "adk_reflect_retry"
    failed = {r["span_id"]: r for r in run_named(run.data, "failures", {}).to_pylist()}
    assert failed[sid]["taxonomy_l3"] == "timeout" and not failed[sid]["recovered"]


def test_a_call_the_plugin_had_retried_recovers_its_failure(run: Capture) -> None:
    (first, _, result), (second, code, answer) = tool_spans(run, "adk-retry")
    assert ADK_REFLECT_RETRY in result and code != 2 and json.loads(answer) == {"result": "Lyon: 21C and sunny"}
    failed = {r["span_id"]: r for r in run_named(run.data, "failures", {}).to_pylist()}
    assert failed[first]["recovered"] and second not in failed


# ADK's plugin answers every failure with its reflection guidance, whose boilerplate asks "Does the
# error suggest that one or more arguments are incorrect, badly formatted, or missing?": only its
# error type and details are read as the tool's error (result_errors.error_message), so a backend
# timeout names the tool. A tool that raises leaves gen_ai.tool.call.id "<not specified>" on its span
# and its model call finishes with "stop": it is linked to that model call by containment and order,
# so adk-badargs-raise names the model call that wrote the rejected time (not under full_path_min,
# which follows the lowest score: the tool that raised scores 1, the model call 2).
MISSES = {"greedy": [], "weighted": [], "agenteval": [],
          "full_path_min": ["adk-badargs-raise: want generate_content openai/gpt-4o-mini, got execute_tool book_taxi"]}


def test_every_conversation_gets_the_root_cause_a_person_names(run: Capture) -> None:
    assert {strategy: misses(run, SCENARIOS, strategy) for strategy in MISSES} == MISSES
