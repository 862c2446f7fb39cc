"""Root causes on REAL OpenAI Agents SDK runs (openinference-instrumentation-openai-agents), issue #30.

openai-agents 0.24 and OpenInference's instrumentation 2.6 run from a pinned venv
(``openai_agents_requirements.txt``), the SDK's own trace upload off (its processors replaced by
OpenInference's), an ``OpenAIChatCompletionsModel`` against the scripted OpenAI-compatible server on
127.0.0.1, the OTel SDK's OTLP/HTTP exporter to a real ``tracedag collect``; the store is built and
scored by the real pipeline. A tool's exception goes to the SDK's default error handler: the model
reads a generic apology, the tool's span says "Tool execution failed. Error details are redacted."
(issue #30 class 3: the arguments the model made up have no error text to be read from).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.normalize.frameworks.fw_capture import VENVS, Capture, answered_turns, captured, misses, step_types
from tests.normalize.frameworks.fw_scenarios import OAI_LLM, openai_agents_scenarios
from tracedag.pipeline.store.views import connect

SCENARIOS = openai_agents_scenarios()
PINNED_VENVS = [VENVS["openai-agents"]]  # built in the background from the start of the run (tests.pinned_venv)
REDACTED = "Tool execution failed. Error details are redacted."


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Capture:
    return captured("openai-agents", SCENARIOS, tmp_path_factory.mktemp("openai-agents"))


def tool_span(run: Capture, conversation: str, name: str) -> tuple[int, str, str]:
    """(status code, status message, output text) of the conversation's first span ``name``."""
    con = connect(run.data)
    try:
        row = con.execute("select status_code, status_message, output_text from spans where conversation_id = ? "
                          "and name = ? order by start_time_unix_nano limit 1", [conversation, name]).fetchone()
    finally:
        con.close()
    assert row is not None, f"{conversation}: no span {name}"
    return int(row[0]), str(row[1] or ""), str(row[2] or "")


def test_the_framework_ran_every_scripted_turn(run: Capture) -> None:
    lines = answered_turns(run)
    assert len(lines) == sum(len(s.turns) for s in SCENARIOS)
    assert lines[1].endswith('"answer": "UserError: Error running tool get_weather: weather backend timed out after 10s"}')
    assert '"answer": "Lyon: 21C and sunny"' in lines[2]


def test_the_sdk_traces_only_to_openinference(run: Capture) -> None:
    # the SDK's default processor (the upload to OpenAI's tracing backend) is not registered
    assert '{"trace_processors": ["OpenInferenceTracingProcessor"]}' in run.stdout.splitlines()


def test_one_llm_step_per_model_call_and_a_tool_step_per_tool(run: Capture) -> None:
    kinds, llm_calls = step_types(run.data)
    assert kinds[OAI_LLM] == "llm"
    assert {kinds[t] for t in ("get_weather", "lookup_order", "book_taxi")} == {"tool"}
    assert kinds["assistant"] == "agent"
    assert llm_calls == len(run.model_requests)


def test_the_default_handler_redacts_the_tool_error_and_a_custom_one_shows_it(run: Capture) -> None:
    code, message, output = tool_span(run, "oai-badargs", "book_taxi")
    assert code == 2 and REDACTED in message and "HH:MM" not in message
    assert output == "An error occurred while running the tool. Please try again."
    code, message, output = tool_span(run, "oai-badargs-shown", "book_taxi")
    assert code == 2 and "time must be HH:MM, got 'around six'" in message and REDACTED not in message
    assert tool_span(run, "oai-badargs-missing", "book_taxi")[:2] == (2, tool_span(run, "oai-badargs", "book_taxi")[1])


# Made-up arguments behind a redacted error (issue #30 class 3): the arguments are checked against the
# schema the tool's span carries (tool.parameters), so a missing or mistyped argument fails the model
# call that wrote it. oai-badargs' "around six" is a string, as the schema asks, but breaks the HH:MM its
# tool's description (tool.description, the docstring "... at a time, HH:MM.") states, and the tool's
# error says nothing else (redacted): the model call that wrote it is named (format_hints).
# agenteval also names the agent whose run the raised tool error ended (its status carries the error).
MISSES = {"greedy": [], "full_path_min": [], "weighted": [],
          "agenteval": ["oai-raise: want get_weather, got assistant"]}


def test_a_redacted_error_and_a_time_that_breaks_the_stated_hh_mm_fail_the_model_call(run: Capture) -> None:
    con = connect(run.data)
    try:
        rows = con.execute("select s.name, r.rule_name, r.explanation from step_scores r join spans s "
                           "on s.trace_id = r.trace_id and s.span_id = r.span_id where s.conversation_id = "
                           "'oai-badargs' and r.metric = 'arguments' and r.score <= 2 order by s.name").fetchall()
    finally:
        con.close()
    assert [(n, rule) for n, rule, _ in rows] == [("book_taxi", "tool_args_format"),
                                                  (OAI_LLM, "emitted_invalid_arguments")]
    assert "time: 'around six' is not HH:MM" in rows[0][2]


def test_every_conversation_gets_the_root_cause_a_person_names(run: Capture) -> None:
    assert {strategy: misses(run, SCENARIOS, strategy) for strategy in MISSES} == MISSES


def test_the_columnar_pass_writes_the_reference_rows(run: Capture, tmp_path: Path) -> None:
    # the tool's description (tool.description) reaches both: the format rule fires in each alike
    from tests.normalize.frameworks.test_fw_toolcall_links import build, read
    from tests.score.test_columnar import assert_same_as_reference

    build(tmp_path / "data", read(run.data, "select * from spans"))
    assert_same_as_reference(tmp_path / "data")
    found = read(tmp_path / "data", "select distinct s.conversation_id from step_scores r join spans s on "
                 "s.trace_id = r.trace_id and s.span_id = r.span_id where r.rule_name = 'tool_args_format'")
    # "around six", and "six" the model then wrote again as "18:00" (recovered: no root cause)
    assert sorted(found.column("conversation_id").to_pylist()) == ["oai-badargs", "oai-badargs-fixed"]
