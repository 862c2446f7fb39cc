"""``tracedag confirm --agent URL``: an agent in a process of its own (tests/replay/confirm_http_agent.py, the
real ``openai`` client) behind an OpenAI-compatible URL, its model a scripted server on loopback, its spans
through a real collector; the check's proxy serves the replaced model call and the recorded tools."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests.replay.remote_agent import completion
from tests.replay.test_confirm import _build_and_score, _checks, _root_causes
from tracedag import instrument as td
from tracedag.pipeline.cli import cli
from tracedag.pipeline.replay.confirm_proxy import wait_for_agent
from tracedag.pipeline.replay.targets import RunInfo, endpoint_target
from tracedag.pipeline.service import CollectorConfig, start_collector

ROOT = Path(__file__).resolve().parents[2]


class Model:
    """A scripted model: offers the first flight of the prompt, NO_FLIGHTS without one, HTTP 529 when down."""

    def __init__(self) -> None:
        self.down = False
        self.prompts: list[str] = []

    def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        prompt = str(body["messages"][-1]["content"])
        self.prompts.append(prompt)
        if self.down:
            return 529, {"error": {"message": "overloaded", "type": "overloaded"}}
        flights = json.loads(prompt.split(": ", 1)[1])
        return 200, completion(f"I found {flights[0]}." if flights else "NO_FLIGHTS")


@contextmanager
def model_server(model: Model) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            status, doc = model.answer(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            data = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def http_agent(otlp: str, model_url: str) -> Iterator[str]:
    """``tests.replay.confirm_http_agent`` in a process of its own; yields its base URL."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.replay.confirm_http_agent", "--otlp", otlp,
                             "--model-url", model_url], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout is not None
        yield f"http://127.0.0.1:{int(proc.stdout.readline())}/v1"
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0


CONVERSATIONS = {  # id -> (message, tools down while it was held, model down, scenario)
    "u-ok": ("I am alex, find flights to Paris", "", False, "paris"),
    "u-search": ("I am alex, find flights to Paris", "flight_search", False, "paris"),
    "u-decoy": ("I am alex, find flights to Atlantis", "profile_lookup", False, "atlantis"),
    "u-model": ("I am alex, find flights to Paris", "", True, "paris"),
}


@pytest.fixture(name="world", scope="module")
def world_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """A store of the four conversations held with the agent over HTTP; the collector, agent and model stay up."""
    data = tmp_path_factory.mktemp("url") / "store"
    model = Model()
    collector = start_collector(CollectorConfig(data=data, http_port=0, grpc_port=None))
    otlp = f"http://127.0.0.1:{collector.http_port}"
    try:
        with model_server(model) as model_url, http_agent(otlp, model_url) as agent:
            _record(otlp, agent, model, data)
            yield World(data, otlp, agent, model, model_url)
    finally:
        collector.stop()


def _record(otlp: str, agent: str, model: Model, data: Path) -> None:
    target = endpoint_target(agent, {})
    td.configure(otlp, service_name=target.service_name, set_global=False, schedule_delay_millis=50)
    try:
        for cid, (message, broken, down, scenario) in CONVERSATIONS.items():
            model.down = down
            with td.conversation(cid), td.run_labels(scenario_id=scenario, broken=broken):
                assert not target.converse([message], RunInfo(cid, cid, 0)).stopped
        model.down = False
        assert td.force_flush(30_000)
    finally:
        td.shutdown()
    assert wait_for_agent(data, dict.fromkeys(CONVERSATIONS, 1), target.service_name)
    _build_and_score(data)


@dataclass(frozen=True)
class World:
    data: Path
    otlp: str  # the collector the agent and the runs export to
    agent: str
    model: Model
    model_url: str

    def confirm(self, *args: str, agent: str | None = None, model_url: str | None = None) -> Any:
        return CliRunner().invoke(cli, ["confirm", "--data", str(self.data), "--agent", agent or self.agent,
                                        "--endpoint", self.otlp, "--model-url", model_url or self.model_url,
                                        "--times", "2", *args])


def test_agent_behind_a_url_root_cause_confirmed_and_decoy_refuted(world: World) -> None:
    data = world.data
    causes = _root_causes(data)
    assert (causes["u-search"]["root_step_name"], causes["u-decoy"]["root_step_name"]) == ("flight_search",
                                                                                            "profile_lookup")
    out = world.confirm("--conversation", "u-search", "--conversation", "u-decoy")
    assert out.exit_code == 0, out.output
    checks = _checks(data)
    search, decoy = checks["u-search"], checks["u-decoy"]
    # the agent asked the proxy for its tools: flight_search got the passing recorded call of u-ok
    assert (search["verdict"], search["runs"], search["failures_after"]) == ("confirmed", 2, 0)
    assert search["replacement_kind"] == "recorded_tool" and str(search["replacement_source"]).startswith("u-ok/")
    assert search["agent"] == world.agent
    # profile_lookup replaced by a passing call: flight_search to Atlantis still fails, so does the answer
    assert (decoy["verdict"], decoy["runs"], decoy["failures_after"]) == ("refuted", 2, 2)


def test_model_call_replaced_at_the_proxy(world: World) -> None:
    data, model = world.data, world.model
    assert _root_causes(data)["u-model"]["root_step_name"] == "chat travel-model"
    model.down = True  # the model is still down: only the proxy's replacement at the root call can answer
    asked = len(model.prompts)
    try:
        out = world.confirm("--conversation", "u-model")
    finally:
        model.down = False
    assert out.exit_code == 0, out.output
    check = _checks(data)["u-model"]
    assert (check["verdict"], check["runs"], check["replacement_kind"]) == ("confirmed", 2, "gold_step")
    assert str(check["replacement_source"]).startswith("u-ok/")
    assert check["replacement_output"] == "I found TD505 to Paris."
    assert len(model.prompts) == asked  # the replaced call never reached the model


def test_unreachable_agent_and_missing_endpoint_are_clear_errors(world: World) -> None:
    data = world.data
    before = _checks(data)
    out = world.confirm(agent="http://127.0.0.1:9/v1")
    assert out.exit_code == 1 and "--agent http://127.0.0.1:9/v1: nothing answers at 127.0.0.1:9" in out.output
    out = CliRunner().invoke(cli, ["confirm", "--data", str(data), "--agent", "http://127.0.0.1:9/v1"])
    assert out.exit_code == 1 and "an agent behind a URL needs it" in out.output
    assert _checks(data) == before  # nothing stored


def test_a_model_the_proxy_cannot_reach_leaves_the_check_inconclusive(world: World) -> None:
    out = world.confirm("--conversation", "u-search", model_url="http://127.0.0.1:9/v1")
    assert out.exit_code == 0, out.output
    check = _checks(world.data)["u-search"]  # the agent failed for want of its model: no run counts
    assert (check["verdict"], check["runs"]) == ("inconclusive", 0)
    assert "none of 2 runs ran to its end" in str(check["reason"])

