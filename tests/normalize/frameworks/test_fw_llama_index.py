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

import pytest

from tests.normalize.frameworks.fw_capture import VENVS, Capture, answered_turns, captured, misses, step_types
from tests.normalize.frameworks.fw_scenarios import llama_index_scenarios

SCENARIOS = llama_index_scenarios()
PINNED_VENVS = [VENVS["llama-index"]]  # built in the background from the start of the run (tests.pinned_venv)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Capture:
    return captured("llama-index", SCENARIOS, tmp_path_factory.mktemp("llama-index"))


def test_the_framework_ran_every_scripted_turn(run: Capture) -> None:
    lines = answered_turns(run)
    assert len(lines) == sum(len(s.turns) for s in SCENARIOS)
    assert lines[1].endswith('"answer": "Lyon: 21C and sunny"}')


def test_the_agent_run_is_an_agent_and_only_model_calls_are_llm_steps(run: Capture) -> None:
    kinds, llm_calls = step_types(run.data)
    assert kinds["FunctionAgent.run"] == "agent"
    assert kinds["OpenAI._prepare_chat_with_tools"] == "chain"
    assert kinds["OpenAI.achat"] == "llm"
    assert kinds["FunctionTool.acall"] == "tool"
    assert llm_calls == len(run.model_requests)  # one llm step per request the model server answered


def test_every_conversation_gets_the_root_cause_a_person_names(run: Capture) -> None:
    for strategy in ("greedy", "full_path_min", "weighted", "agenteval"):
        assert misses(run, SCENARIOS, strategy) == [], strategy
