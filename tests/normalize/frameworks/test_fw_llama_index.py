"""Span typing and root causes on REAL LlamaIndex agent workflows (openinference-instrumentation-llama-index), #30.

llama-index-core 0.14 with its OpenAI LLM and OpenInference instrumentation runs from a pinned venv
(``llama_index_requirements.txt``): a FunctionAgent against the scripted OpenAI-compatible server on
127.0.0.1 (no streaming), exported with the OTel SDK's OTLP/HTTP exporter to a real ``tracedag
collect``, built and scored by the real pipeline. OpenInference types the agent's ``FunctionAgent.run``
CHAIN and ``OpenAI._prepare_chat_with_tools`` (it builds the request, calls no model) LLM; tracedag
types them agent and chain (class 4), so a model call is counted once. LlamaIndex hands a tool's
exception back to the model as the tool's output; an error payload comes back in ``raw_output``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.normalize.frameworks.fw_capture import (
    Capture,
    answers,
    build_and_score,
    capture,
    tally,
    truth_span_ids,
    wrong,
)
from tests.normalize.frameworks.fw_scenarios import llama_index_scenarios
from tracedag.pipeline.store.views import connect

SCENARIOS = llama_index_scenarios()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Capture]:
    cap = capture("llama-index", SCENARIOS, tmp_path_factory.mktemp("llama-index") / "data")
    build_and_score(cap.data)
    yield cap


def test_the_framework_ran_every_scripted_turn(run: Capture) -> None:
    lines = [x for x in run.stdout.splitlines() if x.startswith('{"conversation"')]
    assert len(lines) == sum(len(s.turns) for s in SCENARIOS)
    assert lines[1].endswith('"answer": "Lyon: 21C and sunny"}')


def test_the_agent_run_is_an_agent_and_only_model_calls_are_llm_steps(run: Capture) -> None:
    con = connect(run.data)
    try:
        kinds = dict(con.execute("select name, any_value(step_type) from spans group by name").fetchall())
        llm_calls = con.execute("select count(*) from spans where step_type = 'llm'").fetchall()[0][0]
    finally:
        con.close()
    assert kinds["FunctionAgent.run"] == "agent"
    assert kinds["OpenAI._prepare_chat_with_tools"] == "chain"
    assert kinds["OpenAI.achat"] == "llm"
    assert kinds["FunctionTool.acall"] == "tool"
    assert llm_calls == len(run.model_requests)  # one llm step per request the model server answered


def test_every_conversation_gets_the_root_cause_a_person_names(run: Capture) -> None:
    truth = truth_span_ids(run.data, SCENARIOS)
    for strategy in ("greedy", "full_path_min", "weighted", "agenteval"):
        got = answers(run.data, strategy)
        assert wrong(SCENARIOS, truth, got, run.data) == [], strategy
        assert all(right == n for right, n in tally(SCENARIOS, truth, got).values())
