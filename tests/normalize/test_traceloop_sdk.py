"""Spans of the REAL traceloop-sdk decorators, sent by traceloop's own OTLP exporter to the real collector.

traceloop-sdk cannot be installed beside this project's OpenTelemetry SDK (pyproject.toml), so
it runs out of process, from a cached virtualenv with the exactly pinned set of
``traceloop_requirements.txt`` (``pinned_venv``: ``~/.cache/tracedag-tests/traceloop-venv-...``). The scripted agent
``traceloop_agent.py`` runs there against a collector on loopback port 0 and a local server
speaking the OpenAI API; the assertions read the ``spans`` view with DuckDB and check what a
person reads off the script. A venv that cannot be built (PyPI unreachable) fails the test with
pip's message: it is never skipped.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.pinned_venv import PinnedVenv, client_env
from tests.realspans import chat_completion, fake_openai_server
from tracedag.pipeline.service import CollectorConfig, start_collector
from tracedag.pipeline.store.views import connect

HERE = Path(__file__).resolve().parent
LOCK = HERE / "traceloop_requirements.txt"
AGENT = HERE / "traceloop_agent.py"
REPLY = "Lyon: sunny both days, no taxi."
WEATHER = [f"Lyon day {d}: 21C and sunny" for d in (1, 2)]
PROMPT = "Summarize: " + "; ".join([*WEATHER, "no taxi"])
COLUMNS = ["trace_id", "span_id", "parent_span_id", "name", "service_name", "status_code", "step_type",
           "step_name", "agent_name", "tool_name", "conversation_id", "error_type", "input_text",
           "output_text", "model", "provider", "input_tokens", "output_tokens", "finish_reason", "run_id",
           "scenario_id", "service_version"]


TRACELOOP = PinnedVenv("traceloop-venv", LOCK, "traceloop-sdk", "import openai, traceloop.sdk.decorators")
PINNED_VENVS = [TRACELOOP]  # built in the background from the start of the run (tests.pinned_venv)


# ----------------------------------------------------------------------------------------------
# One run of the scripted agent into a real collector
# ----------------------------------------------------------------------------------------------


@dataclass
class Run:
    """What the agent printed, what the fake model received, and the stored spans (dicts by column)."""

    stdout: str
    model_requests: list[dict[str, Any]]
    spans: list[dict[str, Any]]
    data: Path

    def named(self, name: str) -> list[dict[str, Any]]:
        """The spans called ``name``, in start order."""
        return [s for s in self.spans if s["name"] == name]

    def one(self, name: str) -> dict[str, Any]:
        """The single span called ``name``."""
        found = self.named(name)
        assert len(found) == 1, f"{len(found)} spans named {name!r}: {[s['name'] for s in self.spans]}"
        return found[0]


def agent_env() -> dict[str, str]:
    """The script's environment: no inherited OTel/traceloop settings or proxies, traceloop kept local."""
    env = client_env()
    env.update({
        "TRACELOOP_TELEMETRY": "false",  # older releases' anonymous usage telemetry
        "TRACELOOP_METRICS_ENABLED": "false",
        "TRACELOOP_LOGGING_ENABLED": "false",
        "TRACELOOP_TRACE_CONTENT": "true",
        "TRACELOOP_SUPPRESS_WARNINGS": "true",
    })
    return env


def run_agent(python: Path, data: Path) -> Run:
    """Run ``traceloop_agent.py`` with ``python`` against a collector storing into ``data``."""
    collector = start_collector(CollectorConfig(data=data, http_port=0, grpc_port=None))
    try:
        with fake_openai_server([(200, chat_completion(REPLY, tokens=(40, 9)))]) as model:
            cmd = [str(python), str(AGENT), f"http://127.0.0.1:{collector.http_port}", model.base_url]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=agent_env(),
                                  stdin=subprocess.DEVNULL)
            requests = list(model.requests)
        assert done.returncode == 0, f"the traceloop agent failed:\n{done.stderr[-4000:]}"
        collector.flush()
    finally:
        collector.stop(2)
    query = f"select {', '.join(COLUMNS)} from spans order by start_time_unix_nano"
    rows = connect(data).sql(query).fetchall()
    return Run(done.stdout, requests, [dict(zip(COLUMNS, r, strict=True)) for r in rows], data)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """The agent run once per module (the venv is built on the first run on a machine)."""
    yield run_agent(TRACELOOP.ensure(), tmp_path_factory.mktemp("traceloop") / "data")


# ----------------------------------------------------------------------------------------------
# What a person reads off traceloop_agent.py
# ----------------------------------------------------------------------------------------------


def test_the_agent_ran_and_called_the_scripted_model(run: Run) -> None:
    assert run.stdout.strip().splitlines()[-1] == '{"city": "Lyon", "summary": "' + REPLY + '"}'
    assert len(run.model_requests) == 1
    assert run.model_requests[0]["messages"][-1]["content"] == PROMPT


def test_one_trace_with_the_call_tree_of_the_script(run: Run) -> None:
    assert len({s["trace_id"] for s in run.spans}) == 1
    assert [s["name"] for s in run.spans] == [
        "trip_planner.workflow", "travel_agent.agent", "plan_route.task", "lookup_weather.tool",
        "lookup_weather.tool", "book_taxi.tool", "write_summary.task", "openai.chat",
    ]
    workflow, agent = run.one("trip_planner.workflow"), run.one("travel_agent.agent")
    assert workflow["parent_span_id"] is None
    assert agent["parent_span_id"] == workflow["span_id"]
    children = [s for s in run.spans if s["parent_span_id"] == agent["span_id"]]
    assert [s["name"] for s in children] == [
        "plan_route.task", "lookup_weather.tool", "lookup_weather.tool", "book_taxi.tool",
        "write_summary.task",
    ]
    assert run.one("openai.chat")["parent_span_id"] == run.one("write_summary.task")["span_id"]


def test_step_types_follow_the_traceloop_span_kind(run: Run) -> None:
    kinds = {s["name"]: s["step_type"] for s in run.spans}
    assert kinds == {
        "trip_planner.workflow": "chain",  # normalize_rules: workflow -> chain
        "travel_agent.agent": "agent",
        "plan_route.task": "chain",
        "write_summary.task": "chain",
        "lookup_weather.tool": "tool",
        "book_taxi.tool": "tool",
        "openai.chat": "llm",
    }


def test_step_names_of_the_workflow_the_agent_and_the_tools(run: Run) -> None:
    assert run.one("trip_planner.workflow")["step_name"] == "trip_planner"
    assert run.one("travel_agent.agent")["step_name"] == "travel_agent"
    # the given name, not the function's (weather_tool); one span per loop iteration
    assert [s["step_name"] for s in run.named("lookup_weather.tool")] == ["lookup_weather", "lookup_weather"]
    assert run.one("book_taxi.tool")["step_name"] == "book_taxi"  # the function's name


def test_step_names_of_tasks_and_the_llm_call_inside_the_agent(run: Run) -> None:
    # gen_ai.agent.name is on every span inside the @agent; it names only the agent's own span
    assert run.one("plan_route.task")["step_name"] == "plan_route"
    assert run.one("write_summary.task")["step_name"] == "write_summary"
    assert run.one("openai.chat")["step_name"] == "openai.chat"
    assert step_counts(run.data) == {
        ("chain", "trip_planner"): 1, ("agent", "travel_agent"): 1, ("chain", "plan_route"): 1,
        ("tool", "lookup_weather"): 2, ("tool", "book_taxi"): 1, ("chain", "write_summary"): 1,
        ("llm", "openai.chat"): 1,
    }


def step_counts(data: Path) -> dict[tuple[str, str], int]:
    """The issue's summary query: ``step_type, step_name, count(*)`` over the ``spans`` view."""
    rows = connect(data).sql("select step_type, step_name, count(*) from spans group by all").fetchall()
    return {(t, n): c for t, n, c in rows}


def test_tool_name_only_on_tool_spans_and_agent_name_inside_the_agent(run: Run) -> None:
    tools = {s["name"]: s["tool_name"] for s in run.spans if s["tool_name"] is not None}
    assert tools == {"lookup_weather.tool": "lookup_weather", "book_taxi.tool": "book_taxi"}
    assert run.one("trip_planner.workflow")["agent_name"] is None
    assert {s["agent_name"] for s in run.spans[1:]} == {"travel_agent"}


def test_the_raising_tool_is_the_only_error(run: Run) -> None:
    taxi = run.one("book_taxi.tool")
    assert (taxi["status_code"], taxi["error_type"]) == (2, "TimeoutError")
    assert taxi["output_text"] is None
    others = [(s["name"], s["status_code"], s["error_type"]) for s in run.spans if s is not taxi]
    assert all(code != 2 and err is None for _, code, err in others), others  # the agent caught it


def test_conversation_id_from_the_association_properties_on_every_span(run: Run) -> None:
    assert {s["conversation_id"] for s in run.spans} == {"chat-42"}


def test_resource_labels(run: Run) -> None:
    labels = {(s["service_name"], s["run_id"], s["scenario_id"], s["service_version"]) for s in run.spans}
    assert labels == {("trip-agent", "run-tl-1", "trip", "2.0.0")}


def test_input_and_output_text_from_the_entity_payloads(run: Run) -> None:
    def io(span: dict[str, Any]) -> tuple[str, str]:
        return span["input_text"], span["output_text"]

    # a single positional argument is the input; several stay a JSON list
    assert io(run.one("trip_planner.workflow")) == ("Lyon", '{"city": "Lyon", "summary": "' + REPLY + '"}')
    assert io(run.one("travel_agent.agent")) == ("Lyon", REPLY)
    assert io(run.one("plan_route.task")) == ("Lyon", '{"city": "Lyon", "days": 2}')
    assert [io(s) for s in run.named("lookup_weather.tool")] == [
        ('["Lyon", 1]', WEATHER[0]), ('["Lyon", 2]', WEATHER[1])]
    assert run.one("book_taxi.tool")["input_text"] == "Lyon"
    assert io(run.one("write_summary.task")) == ('["' + '", "'.join(WEATHER) + '", "no taxi"]', REPLY)


def test_the_llm_call_columns(run: Run) -> None:
    chat = run.one("openai.chat")
    assert chat["input_text"] == PROMPT  # the last user message
    assert chat["output_text"] == REPLY
    got = [chat[c] for c in ("model", "provider", "input_tokens", "output_tokens", "finish_reason")]
    assert got == ["gpt-4o-mini", "openai", 40, 9, "stop"]
