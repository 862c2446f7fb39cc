"""``tracedag replay`` and ``tracedag simulate`` towards a collector that does not take the spans: a
collector that is not there (nothing runs), and a real collector that answers but refuses every batch
(``--max-body`` smaller than any batch: HTTP 413). Both exit non-zero and say that nothing was stored."""

from __future__ import annotations

import shutil
import signal
import socket

import pytest

from tests.collector.collector_support import start_process, stop_process
from tests.dag.spanbuild import q
from tests.replay.replay_support import BOOKING_TURNS, example_store, run_tracedag


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return example_store(tmp_path_factory.mktemp("src") / "data", {"c-book": BOOKING_TURNS})


@pytest.fixture(scope="module")
def refusing(tmp_path_factory):
    """A real collector whose body limit is below any span batch: it answers, and refuses every export (one
    for the module: what it refused leaves nothing behind, so the tests that use it cannot see each other)."""
    collected = tmp_path_factory.mktemp("refusing") / "collected"
    proc, http_port, _ = start_process(collected, "--max-body", "100")
    yield f"http://127.0.0.1:{http_port}", collected
    stop_process(proc, signal.SIGTERM)


DEAD = {"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "2"}
"""The OTLP exporter's own timeout (the standard variable) for a run towards a port nobody listens on: its
probe retries a refused connection after 1, 2, 4 s within the timeout (10 s by default, ~7 s of waiting);
within 2 s it still retries once, after 1 s, and gives up as it would after 10."""


def _dead_endpoint():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def _copy(source, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(source, data)
    return data


def test_replay_to_a_collector_that_is_down_runs_nothing(source, tmp_path):
    data = _copy(source, tmp_path)
    endpoint = _dead_endpoint()
    res = run_tracedag("replay", "--data", data, "--agent", "example", "--endpoint", endpoint, env=DEAD)
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"the collector at {endpoint} does not accept spans" in res.stderr
    assert "nothing was run, nothing was stored" in res.stderr and "Traceback" not in res.stderr


def test_replay_whose_spans_the_collector_refuses_says_nothing_was_stored(source, tmp_path, refusing):
    endpoint, collected = refusing
    res = run_tracedag("replay", "--data", _copy(source, tmp_path), "--agent", "example", "--agent-opt",
                       "fault_rate=0", "--endpoint", endpoint)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "1 of 1 runs finished" in res.stdout  # the run itself ran
    assert f"nothing was stored: the collector behind {endpoint} did not take the spans" in res.stdout
    assert "next:" not in res.stdout
    assert not list(collected.rglob("seg-*"))  # and indeed: no spool segment


def test_simulate_to_a_collector_that_is_down_or_refusing_exits_1(refusing):
    dead = _dead_endpoint()
    down = run_tracedag("simulate", "--endpoint", dead, "--replays", "1", "--variants", "0", env=DEAD)
    assert down.returncode == 1 and f"the collector at {dead} does not accept spans" in down.stderr, \
        down.stdout + down.stderr
    endpoint, _ = refusing
    refused = run_tracedag("simulate", "--endpoint", endpoint, "--replays", "1", "--variants", "0")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert f"nothing was stored: the collector behind {endpoint} did not take the spans" in refused.stderr


def test_simulated_users_to_a_collector_that_is_down_exit_1(tmp_path):
    dead = _dead_endpoint()
    res = run_tracedag("simulate", "--agent", "example", "--graph", "example", "--persona", "terse",
                       "--endpoint", dead, env=DEAD)
    assert res.returncode == 1 and "nothing was run, nothing was stored" in res.stderr, res.stdout + res.stderr


def test_simulate_exits_0_when_every_conversation_ran_though_some_failed(tmp_path):
    """The bundled agent with faults: failed conversations are a result (counted), not an error; with
    --fail-on-failure they are the exit code."""
    proc, http_port, _ = start_process(tmp_path / "data")
    try:
        args = ("simulate", "--endpoint", f"http://127.0.0.1:{http_port}", "--replays", "1", "--variants", "0",
                "--fault-rate", "1")
        res = run_tracedag(*args)
        assert res.returncode == 0, res.stdout + res.stderr
        assert " failed, " in res.stdout and "(0 failed" not in res.stdout
        strict = run_tracedag(*args, "--fail-on-failure", "--simulation-id", "strict")
        assert strict.returncode == 1 and "conversations failed (--fail-on-failure)" in strict.stderr
    finally:
        stop_process(proc, signal.SIGTERM)
    assert q(tmp_path / "data", "select count(distinct run_id) > 0 from spans")[0][0]
