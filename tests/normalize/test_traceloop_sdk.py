"""Spans of the REAL traceloop-sdk decorators, sent by traceloop's own OTLP exporter to the real collector.

traceloop-sdk cannot be installed beside this project's OpenTelemetry SDK (pyproject.toml), so
it runs out of process: a virtualenv with the exactly pinned set of ``traceloop_requirements.txt``
is created once (``sys.executable -m venv`` + the venv's pip, from PyPI) and cached under
``~/.cache/tracedag-tests/traceloop-venv-<version>-py<X.Y>-<hash>`` (built in a temporary
directory, then renamed into place, so a half-built venv is never used). The scripted agent
``traceloop_agent.py`` runs there against a collector on loopback port 0 and a local server
speaking the OpenAI API; the assertions read the ``spans`` view with DuckDB and check what a
person reads off the script. A venv that cannot be built (PyPI unreachable) fails the test with
pip's message: it is never skipped.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from realspans import chat_completion, fake_openai_server

from tracedag.collector.server import CollectorConfig, start_collector
from tracedag.pipeline.views import connect

HERE = Path(__file__).resolve().parent
LOCK = HERE / "traceloop_requirements.txt"
AGENT = HERE / "traceloop_agent.py"
STAMP = "tracedag-lock.txt"
PIP_TIMEOUT = 420
REPLY = "Lyon: sunny both days, no taxi."
WEATHER = [f"Lyon day {d}: 21C and sunny" for d in (1, 2)]
PROMPT = "Summarize: " + "; ".join([*WEATHER, "no taxi"])
COLUMNS = ["trace_id", "span_id", "parent_span_id", "name", "service_name", "status_code", "step_type",
           "step_name", "agent_name", "tool_name", "conversation_id", "error_type", "input_text",
           "output_text", "model", "provider", "input_tokens", "output_tokens", "finish_reason", "run_id",
           "scenario_id", "service_version"]


# ----------------------------------------------------------------------------------------------
# The cached virtualenv
# ----------------------------------------------------------------------------------------------


def traceloop_version() -> str:
    """The traceloop-sdk version pinned in the lock file."""
    found = re.search(r"^traceloop-sdk==(\S+)$", LOCK.read_text(), re.MULTILINE)
    assert found, f"{LOCK} pins no traceloop-sdk version"
    return found.group(1)


def venv_dir() -> Path:
    """Where the venv of this lock file and this Python lives (a new lock gets a new venv)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tracedag-tests"
    digest = hashlib.sha256(LOCK.read_bytes()).hexdigest()[:12]
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    return cache / f"traceloop-venv-{traceloop_version()}-py{py}-{digest}"


def venv_python(venv: Path) -> Path:
    """The interpreter of ``venv``."""
    return venv / "bin" / "python"


def usable(venv: Path) -> bool:
    """True when ``venv`` is complete (its stamp, written last, holds this lock) and its python resolves."""
    stamp = venv / STAMP
    if not (stamp.is_file() and venv_python(venv).exists()):
        return False
    return stamp.read_text() == LOCK.read_text()


def _run_or_fail(cmd: list[str], what: str, timeout: float) -> None:
    """Run ``cmd``; on failure or timeout fail the test with its output (never a skip)."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{what} timed out after {timeout:.0f} s (is PyPI reachable?): {' '.join(cmd)}\n"
                    f"{exc.stderr}")
    if done.returncode != 0:
        noise = "is ignored: it is neither a file nor a directory"
        err = "\n".join(line for line in done.stderr.splitlines() if noise not in line)
        pytest.fail(f"{what} failed (exit {done.returncode}; is PyPI reachable?): {' '.join(cmd)}\n"
                    f"{err[-4000:]}\n{done.stdout[-2000:]}")


def build_venv(target: Path) -> None:
    """Create a venv at ``target`` with the pinned set installed, checked importable, then stamped."""
    _run_or_fail([sys.executable, "-m", "venv", str(target)], "creating the traceloop-sdk virtualenv", 120)
    py = str(venv_python(target))
    pip = [py, "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "-q", "-r", str(LOCK)]
    _run_or_fail(pip, f"installing traceloop-sdk=={traceloop_version()} from PyPI", PIP_TIMEOUT)
    imports = [py, "-c", "import openai, traceloop.sdk.decorators"]
    _run_or_fail(imports, "importing traceloop-sdk in its venv", 120)
    (target / STAMP).write_text(LOCK.read_text())


def remove_abandoned_builds(cache: Path, age_seconds: float = 3600) -> None:
    """Remove the build directories of runs killed mid-build (older than ``age_seconds``)."""
    for old in cache.glob(".build-*"):
        if time.time() - old.stat().st_mtime > age_seconds:
            shutil.rmtree(old, ignore_errors=True)


def ensure_venv() -> Path:
    """The python of the cached traceloop venv, built first when missing (atomically: temp dir, rename).

    Only ``bin/python`` is used after the rename: it finds its site-packages through the
    ``pyvenv.cfg`` beside it, whereas the venv's console scripts keep the build path in their shebang.
    """
    final = venv_dir()
    if usable(final):
        return venv_python(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_abandoned_builds(final.parent)
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=final.parent))
    try:
        build_venv(work / "venv")
        if usable(final):  # a concurrent run published first: use its venv
            return venv_python(final)
        if final.exists():  # incomplete or stale: moved aside, then removed with the work dir
            final.rename(work / "stale")
        (work / "venv").rename(final)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return venv_python(final)


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
    drop = ("OTEL_", "TRACELOOP_", "PYTHON")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop) and "proxy" not in k.lower()}
    env.update({
        "NO_PROXY": "127.0.0.1,localhost",
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
    yield run_agent(ensure_venv(), tmp_path_factory.mktemp("traceloop") / "data")


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
