"""Root causes on REAL pydantic-ai runs (its native OpenTelemetry instrumentation), issue #30.

pydantic-ai-slim 2.68 runs from a pinned venv (``pydantic_ai_requirements.txt``) with
``Agent.instrument_all(InstrumentationSettings(tracer_provider=...))`` (no logfire), against the
scripted OpenAI-compatible server on 127.0.0.1, exporting with the OTel SDK's OTLP/HTTP exporter to
a real ``tracedag collect``; the store is built and scored by the real pipeline. A tool that raises
ends the run; ``ModelRetry`` asks the model again (a retry when the call is redone); an error
payload fails its tool; a time written as words fails the model call that wrote it.
"""

from __future__ import annotations

import pytest

from tests.normalize.frameworks.fw_capture import VENVS, Capture, answered_turns, captured, misses
from tests.normalize.frameworks.fw_scenarios import pydantic_ai_scenarios
from tracedag.pipeline.store.querying import run_named
from tracedag.pipeline.store.views import connect

SCENARIOS = pydantic_ai_scenarios()
PINNED_VENVS = [VENVS["pydantic-ai"]]  # built in the background from the start of the run (tests.pinned_venv)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Capture:
    return captured("pydantic-ai", SCENARIOS, tmp_path_factory.mktemp("pydantic-ai"))


def test_the_framework_ran_every_scripted_turn(run: Capture) -> None:
    lines = answered_turns(run)
    assert len(lines) == sum(len(s.turns) for s in SCENARIOS)
    assert lines[0].endswith('"answer": "TimeoutError: weather backend timed out after 10s"}')


def test_the_error_payload_fails_the_tool_and_the_bad_time_the_model_call(run: Capture) -> None:
    con = connect(run.data)
    try:
        names = {sid: (conv, name) for sid, conv, name in
                 con.execute("select span_id, conversation_id, name from spans").fetchall()}
    finally:
        con.close()
    failed = {names[r["span_id"]]: r["taxonomy_l3"] for r in run_named(run.data, "failures", {}).to_pylist()
              if names[r["span_id"]][0] in ("pyai-payload", "pyai-badargs")}
    assert failed[("pyai-payload", "execute_tool lookup_order")] == "tool_error"
    assert failed[("pyai-badargs", "chat gpt-4o-mini")] == "invalid_tool_arguments"


def test_every_conversation_gets_the_root_cause_a_person_names(run: Capture) -> None:
    for strategy in ("greedy", "full_path_min", "weighted", "agenteval"):
        assert misses(run, SCENARIOS, strategy) == [], strategy
