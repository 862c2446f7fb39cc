"""Span typing and root causes on REAL Strands agents (their native OTel GenAI spans), issue #30.

strands-agents 1.62 runs from a pinned venv (``strands_requirements.txt``) with its OpenAIModel
against the scripted OpenAI-compatible server on 127.0.0.1 (streamed, ``fw_model``), its spans sent
through the global tracer provider by the OTel SDK's OTLP/HTTP exporter to a real ``tracedag
collect``, built and scored by the real pipeline. Strands wraps each model call and the tools it asked
for in ``execute_event_loop_cycle``, which carries ``gen_ai.system``: it is a chain, not a second
model call (class 4). A tool's exception goes back to the model as an error tool result.
"""

from __future__ import annotations

import pytest

from tests.normalize.frameworks.fw_capture import VENVS, Capture, answered_turns, captured, misses, step_types
from tests.normalize.frameworks.fw_scenarios import strands_scenarios

SCENARIOS = strands_scenarios()
PINNED_VENVS = [VENVS["strands"]]  # built in the background from the start of the run (tests.pinned_venv)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Capture:
    return captured("strands", SCENARIOS, tmp_path_factory.mktemp("strands"))


def test_the_framework_ran_every_scripted_turn(run: Capture) -> None:
    lines = answered_turns(run)
    assert len(lines) == sum(len(s.turns) for s in SCENARIOS)
    assert lines[1].endswith('"answer": "Lyon: 21C and sunny"}')


def test_one_llm_step_per_model_call(run: Capture) -> None:
    kinds, llm_calls = step_types(run.data)
    assert kinds["execute_event_loop_cycle"] == "chain"
    assert kinds["chat"] == "llm"
    assert kinds["invoke_agent Strands Agents"] == "agent"
    assert llm_calls == len(run.model_requests)


def test_every_conversation_gets_the_root_cause_a_person_names(run: Capture) -> None:
    assert misses(run, SCENARIOS) == []


def test_a_tool_span_s_own_schema_checks_its_arguments(run: Capture) -> None:
    # Strands gives the model no tool definitions on its spans; the tool span carries its own schema
    # (gen_ai.tool.json_schema), which checks the arguments whatever the error text says (#30 class 3)
    from tracedag.pipeline.store.views import connect

    con = connect(run.data)
    try:
        rows = con.execute("""
            select s.name, c.rule_name, c.score, c.explanation from step_scores c
            join spans s on s.trace_id = c.trace_id and s.span_id = c.span_id
            where s.conversation_id = 'strands-badargs-missing' and c.metric = 'arguments'
            order by s.start_time_unix_nano""").fetchall()
        clean = con.execute("""
            select count(*), count(*) filter (where c.score <= 2) from step_scores c
            join spans s on s.trace_id = c.trace_id and s.span_id = c.span_id
            where s.conversation_id like 'strands-clean%' and c.metric = 'arguments'""").fetchall()
    finally:
        con.close()
    assert [(n, r, s) for n, r, s, _ in rows] == [("chat", "emitted_invalid_arguments", 2.0),
                                                  ("execute_tool book_taxi", "tool_args_schema", 2.0)]
    assert "(root): 'time' is a required property" in rows[1][3]
    assert clean == [(2, 0)]  # the clean runs' tool calls fit their schemas
