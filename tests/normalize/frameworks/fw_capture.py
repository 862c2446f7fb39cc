"""Conversations of REAL agent frameworks, captured by a real ``tracedag collect``, with known root causes.

Plain module used by tests/normalize/frameworks/test_fw_*.py and bench/frameworks_rca.py. Each framework runs
from a pinned virtualenv of its own (``tests.pinned_venv``; the lock files sit beside this module)
as a script (``<framework>_agent.py``) that drives the framework's agent with its own OpenTelemetry
instrumentation, against the scripted OpenAI-compatible server of ``fw_model`` (streams too) on
127.0.0.1, and exports with the real OTel SDK's OTLP/HTTP exporter to a collector on loopback
port 0 started here. The store is then built and scored by the real pipeline, and ``root_causes``
is read per conversation.

A scenario's truth is the span a person names as the root cause, given as (turn, span name, k):
the k-th span of that name (in start order, from 0) in that turn of the conversation; None when
the conversation does not fail.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.normalize.frameworks.fw_model import scripted_model
from tests.pinned_venv import PinnedVenv, client_env
from tests.realspans import chat_completion

HERE = Path(__file__).resolve().parent

VENVS = {
    "smolagents": PinnedVenv("smolagents-venv", HERE / "smolagents_requirements.txt", "smolagents",
                             "import smolagents, openinference.instrumentation.smolagents"),
    "pydantic-ai": PinnedVenv("pydantic-ai-venv", HERE / "pydantic_ai_requirements.txt", "pydantic-ai-slim",
                              "import pydantic_ai, opentelemetry.exporter.otlp.proto.http"),
    "llama-index": PinnedVenv("llama-index-venv", HERE / "llama_index_requirements.txt", "llama-index-core",
                              "import llama_index.core.agent.workflow, llama_index.llms.openai, "
                              "openinference.instrumentation.llama_index"),
    "strands": PinnedVenv("strands-venv", HERE / "strands_requirements.txt", "strands-agents",
                          "import strands, strands.models.openai, opentelemetry.exporter.otlp.proto.http"),
    "openai-agents": PinnedVenv("openai-agents-venv", HERE / "openai_agents_requirements.txt", "openai-agents",
                                "import agents, openinference.instrumentation.openai_agents, "
                                "opentelemetry.exporter.otlp.proto.http"),
    "google-adk": PinnedVenv("google-adk-venv", HERE / "google_adk_requirements.txt", "google-adk",
                             "import google.adk.runners, google.adk.models.lite_llm, "
                             "google.adk.plugins.reflect_retry_tool_plugin, opentelemetry.exporter.otlp.proto.http",
                             pip_timeout=1200),
}
SCRIPTS = {"smolagents": HERE / "smolagents_agent.py", "pydantic-ai": HERE / "pydantic_ai_agent.py",
           "llama-index": HERE / "llama_index_agent.py", "strands": HERE / "strands_agent.py",
           "openai-agents": HERE / "openai_agents_agent.py", "google-adk": HERE / "google_adk_agent.py"}

Truth = tuple[int, str, int] | None
Reply = tuple[int, dict[str, Any]]


@dataclass
class Scenario:
    """One conversation: its prompts, the model's scripted replies in order, its class and truth."""

    conversation: str
    klass: str
    turns: list[str]
    replies: list[Reply]
    truth: Truth
    options: dict[str, Any] = field(default_factory=dict)  # passed to the agent script as is


def call(cid: str, name: str, args: Any) -> dict[str, Any]:
    """A tool call the scripted model makes."""
    return {"id": cid, "name": name, "args": args}


def reply(content: str | None = None, calls: list[dict[str, Any]] | None = None) -> Reply:
    """A 200 chat-completions reply: text, tool calls, or both."""
    return 200, chat_completion(content, calls)


@dataclass
class Capture:
    """A store holding a framework's captured conversations, and what the scripts printed."""

    framework: str
    data: Path
    stdout: str
    model_requests: list[dict[str, Any]]


def capture(framework: str, scenarios: Sequence[Scenario], data: Path) -> Capture:
    """Run ``scenarios`` with ``framework``'s agent into a collector storing into ``data``."""
    from tracedag.pipeline.service import CollectorConfig, start_collector

    python = VENVS[framework].ensure()
    replies = [r for s in scenarios for r in s.replies]
    spec = [{"conversation": s.conversation, "turns": s.turns, **s.options} for s in scenarios]
    collector = start_collector(CollectorConfig(data=data, http_port=0, grpc_port=None))
    try:
        with tempfile.TemporaryDirectory() as tmp, scripted_model(replies) as model:
            spec_file = Path(tmp) / "scenarios.json"
            spec_file.write_text(json.dumps(spec))
            cmd = [str(python), str(SCRIPTS[framework]), f"http://127.0.0.1:{collector.http_port}",
                   model.base_url, str(spec_file)]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=client_env(),
                                  stdin=subprocess.DEVNULL)
            requests = list(model.requests)
            left = list(model.replies)
        assert done.returncode == 0, f"the {framework} agent failed:\n{done.stderr[-4000:]}"
        assert not left, f"{len(left)} scripted replies were never asked for:\n{done.stdout}\n{done.stderr[-3000:]}"
        collector.flush()
    finally:
        collector.stop(2)
    return Capture(framework, data, done.stdout, requests)


def build_and_score(data: Path) -> None:
    """Build the DAGs and score the steps of the store at ``data`` (the real pipeline)."""
    from tracedag.pipeline.dag import build_store
    from tracedag.pipeline.score import score_store

    build_store(data, idle_seconds=0)
    score_store(data)


def truth_span_ids(data: Path, scenarios: Sequence[Scenario]) -> dict[str, str | None]:
    """Conversation -> the span id its truth names (None: the conversation does not fail)."""
    from tracedag.pipeline.store.views import connect

    con = connect(data)
    try:
        rows = con.execute("select conversation_id, trace_id, span_id, name, start_time_unix_nano from spans "
                           "order by start_time_unix_nano, span_id").fetchall()
    finally:
        con.close()
    out: dict[str, str | None] = {}
    for s in scenarios:
        if s.truth is None:
            out[s.conversation] = None
            continue
        turn, name, k = s.truth
        traces = list(dict.fromkeys(t for c, t, *_ in rows if c == s.conversation))
        named = [sid for c, t, sid, n, _ in rows if c == s.conversation and t == traces[turn - 1] and n == name]
        assert len(named) > k, f"{s.conversation}: no span {name!r} #{k} in turn {turn}: {named}"
        out[s.conversation] = named[k]
    return out


def answers(data: Path, strategy: str = "greedy") -> dict[str, str | None]:
    """Conversation -> the root-cause span id ``root_causes per=conversation`` names (None: not failed)."""
    from tracedag.pipeline.store.querying import run_named

    got: dict[str, str | None] = {}
    for r in run_named(data, "root_causes", {"strategy": strategy, "per": "conversation"}).to_pylist():
        got[r["conversation_id"]] = r["root_span_id"]
    return got


def tally(scenarios: Sequence[Scenario], truth: dict[str, str | None],
          got: dict[str, str | None]) -> dict[str, tuple[int, int]]:
    """Per class: (right, conversations)."""
    out: dict[str, tuple[int, int]] = {}
    for s in scenarios:
        right, n = out.get(s.klass, (0, 0))
        out[s.klass] = (right + (got.get(s.conversation) == truth[s.conversation]), n + 1)
    return out


def wrong(scenarios: Sequence[Scenario], truth: dict[str, str | None], got: dict[str, str | None],
          data: Path) -> list[str]:
    """The conversations answered wrong, each with the span names expected and got."""
    from tracedag.pipeline.store.views import connect

    con = connect(data)
    try:
        names = dict(con.execute("select span_id, name from spans").fetchall())
    finally:
        con.close()
    return [f"{s.conversation}: want {names.get(truth[s.conversation] or '')}, got {names.get(got.get(s.conversation) or '')}"
            for s in scenarios if got.get(s.conversation) != truth[s.conversation]]


def captured(framework: str, scenarios: Sequence[Scenario], tmp: Path) -> Capture:
    """``scenarios`` captured from ``framework`` into a store under ``tmp``, built and scored."""
    cap = capture(framework, scenarios, tmp / "data")
    build_and_score(cap.data)
    return cap


def answered_turns(run: Capture) -> list[str]:
    """The JSON line the framework's script printed for each turn it ran."""
    return [x for x in run.stdout.splitlines() if x.startswith('{"conversation"')]


def step_types(data: Path) -> tuple[dict[str, str], int]:
    """Span name -> its step_type, and how many spans are llm steps."""
    from tracedag.pipeline.store.views import connect

    con = connect(data)
    try:
        kinds = dict(con.execute("select name, any_value(step_type) from spans group by name").fetchall())
        llm_calls = con.execute("select count(*) from spans where step_type = 'llm'").fetchall()[0][0]
    finally:
        con.close()
    return kinds, int(llm_calls)


def misses(run: Capture, scenarios: Sequence[Scenario], strategy: str = "greedy") -> list[str]:
    """The conversations ``strategy`` answers wrong; the tally of right answers must agree with it."""
    truth = truth_span_ids(run.data, scenarios)
    got = answers(run.data, strategy)
    missed = wrong(scenarios, truth, got, run.data)
    assert sum(right for right, _ in tally(scenarios, truth, got).values()) == len(scenarios) - len(missed)
    return missed
