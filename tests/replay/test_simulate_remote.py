"""``tracedag simulate`` against an agent behind a URL (its nodes read back from the store by trace id),
``--parallel`` and the exit code, in real processes: a ``tracedag collect`` process, an
OpenAI-compatible agent server with its own OpenTelemetry SDK (tests/replay/remote_agent.py), and the
``tracedag`` command (``--parallel`` against one at a time, and the in-process agent the URL agent is compared
with, whose processes show nothing more, run in this process through click's runner)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from opentelemetry import context as otel_context
from opentelemetry import propagate
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.collector.collector_support import start_process, stop_process
from tests.dag.spanbuild import q
from tests.replay.replay_support import CLI, in_process, run_tracedag, sim_files  # noqa: F401  (a fixture)
from tracedag import instrument as td
from tracedag.pipeline.replay.remote import StoredSpan, remote_visits, settled

ROOT = Path(__file__).resolve().parents[2]
IN_PROCESS = "tests.replay.sim_agents:wrong_branch"
# hand-worked in test_simulate_users.py for this agent logic on the tiny graph with B=2: i01 completes,
# i02 goes to x instead of y on each of its 3 tries (1 of 2 transitions), i03 completes
HAND_WORKED = "CCR 66.7%, PCR 83.3% over 3 conversations (5 runs"


def _tracedag(*args, timeout=240):
    return run_tracedag(*args, timeout=timeout)


@contextmanager
def remote_agent(otlp: str, *args: str) -> Iterator[str]:
    """``tests.replay.remote_agent`` in a process of its own exporting to ``otlp``; yields its base URL."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.replay.remote_agent", "--otlp", otlp, *args],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout is not None
        yield f"http://127.0.0.1:{int(proc.stdout.readline())}/v1"
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)


@contextmanager
def collector(data: Path) -> Iterator[str]:
    """``tracedag collect --data DATA`` as a process of its own (ports 0); yields its OTLP/HTTP URL."""
    proc, http_port, _ = start_process(data)
    try:
        yield f"http://127.0.0.1:{http_port}"
    finally:
        assert stop_process(proc) == 0


@pytest.fixture(scope="module")
def shared_collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """One ``tracedag collect`` process for the tests that assert nothing about the whole store it writes
    (each reads, at most, its own traces: their ids are random); yields its OTLP/HTTP URL and data directory."""
    data = tmp_path_factory.mktemp("shared-collector") / "data"
    with collector(data) as otlp:
        yield otlp, data


def _summary(stdout: str) -> str:
    """The table and the CCR line without the rate (conversations/s) and where the spans went."""
    text = re.sub(r", [\d.]+ conversations/s\).*", ")", stdout)
    return "\n".join(line for line in text.splitlines() if not line.startswith(("next:", "agent's node spans")))


def test_agent_behind_a_url_gets_the_in_process_ccr_and_pcr_from_its_own_spans(files, tmp_path):
    graph, personas = files
    data = tmp_path / "data"
    common = ["--graph", graph, "--personas", personas, "--max-backtracks", 2, "--max-visits", 1]
    with collector(data) as otlp, remote_agent(otlp) as url:
        remote = _tracedag("simulate", "--agent", url, *common, "--data", data, "--endpoint", otlp)
    assert remote.returncode == 0, remote.stdout + remote.stderr
    assert HAND_WORKED in remote.stdout
    # 9 turns: i01 2, i02 3 tries x 2, i03 1; every one found in the store
    assert "9 traces waited for, 0 not complete" in remote.stdout
    local = in_process("simulate", "--agent", IN_PROCESS, *common, "--data", tmp_path / "local")  # the reference
    assert local.returncode == 0, local.stdout + local.stderr
    assert _summary(remote.stdout) == _summary(local.stdout)

    # the agent's spans continue the simulation's traces (W3C traceparent) and carry its run labels (baggage)
    rows = q(data, """select a.run_id, a.scenario_id, a.replay_index
                      from spans a join spans s on s.span_id = a.parent_span_id and s.trace_id = a.trace_id
                      where a.service_name = 'remote-agent' and a.name = 'POST /v1/chat/completions'
                        and s.service_name like 'endpoint %' and s.name like 'invoke_agent endpoint %'
                      order by 1""")
    assert rows == [("usersim-seed7/c0/i01/plain/r0", "i01", 0),
                                     ("usersim-seed7/c0/i01/plain/r0", "i01", 0),
                                     ("usersim-seed7/c0/i02/plain/r0", "i02", 0),
                                     ("usersim-seed7/c0/i02/plain/r0", "i02", 0),
                                     ("usersim-seed7/c0/i02/plain/r1", "i02", 1),
                                     ("usersim-seed7/c0/i02/plain/r1", "i02", 1),
                                     ("usersim-seed7/c0/i02/plain/r2", "i02", 2),
                                     ("usersim-seed7/c0/i02/plain/r2", "i02", 2),
                                     ("usersim-seed7/c0/i03/plain/r0", "i03", 0)]
    nodes = q(data, """select run_id, string_agg(attributes['gen_ai.node.name'], '>' order by start_time_unix_nano)
                       from spans where service_name = 'remote-agent' and attributes['gen_ai.node.name'] is not null
                       group by all order by 1""")
    assert nodes == [("usersim-seed7/c0/i01/plain/r0", "router>ask>x")] + [
        (f"usersim-seed7/c0/i02/plain/r{i}", "router>ask>x") for i in range(3)] + [
        ("usersim-seed7/c0/i03/plain/r0", "router>z")]


def test_an_agent_that_ignores_the_trace_context_is_waited_for_once_and_said_so(files, shared_collector):
    graph, personas = files
    otlp, data = shared_collector
    with remote_agent(otlp, "--no-propagate") as url:
        started = time.monotonic()
        res = _tracedag("simulate", "--agent", url, "--graph", graph, "--personas", personas, "--max-backtracks", 0,
                        "--max-visits", 1, "--data", data, "--endpoint", otlp, "--settle", 2)
        took = time.monotonic() - started
    assert res.returncode == 0, res.stdout + res.stderr
    assert "CCR 0.0%, PCR 0.0% over 3 conversations (3 runs" in res.stdout
    assert "1 traces waited for, 1 not complete within --settle 2 s; none arrived" in res.stdout
    assert "the agent must extract the W3C traceparent header" in res.stdout
    assert took < 30  # one wait of 2 s, not one a turn


def test_a_url_agent_without_a_store_to_read_says_how_to_give_one(files, shared_collector):
    graph, personas = files
    otlp, _ = shared_collector
    with remote_agent(otlp) as url:
        res = _tracedag("simulate", "--agent", url, "--graph", graph, "--personas", personas, "--max-backtracks", 0,
                        "--max-visits", 1, "--endpoint", otlp)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "CCR 0.0%" in res.stdout and "give --data DIR" in res.stdout


def test_parallel_gives_the_same_result_as_one_at_a_time(tmp_path):
    # the permissive example agent with faults (fault_rate 0.25): restarts and failed runs, seeded by run id
    args = ["--agent", "example", "--graph", "example", "--agent-opt", "variant=permissive", "--persona", "terse",
            "--persona", "rude", "--conversations", 2, "--max-visits", 1]
    one = in_process("simulate", *args, "--data", tmp_path / "p1")
    four = in_process("simulate", *args, "--data", tmp_path / "p4", "--parallel", 4)
    # some runs failed (the agent's faults): a result, counted in CCR/PCR, not an error of the simulation
    assert one.returncode == four.returncode == 0, one.stdout + four.stdout
    assert re.search(r"[1-9]\d* of \d+ runs failed, 0 could not run", one.stdout), one.stdout
    assert re.search(r"overall .* 12 +│ (\d+) +│ [1-9]\d* +│", one.stdout), one.stdout  # restarts were made
    assert _summary(one.stdout.replace(str(tmp_path / "p1"), "DIR")) == \
        _summary(four.stdout.replace(str(tmp_path / "p4"), "DIR"))
    assert "over 12 conversations" in one.stdout  # 3 paths x 2 personas x 2
    runs = "select run_id, count(*), max(status_code) from spans where run_id is not null group by all order by 1"
    assert q(tmp_path / "p1", runs) == q(tmp_path / "p4", runs)


def test_a_run_that_could_not_run_is_named_and_the_exit_code_is_1(files, tmp_path):
    # i03 (router > z): the agent raises after router on each of the 1 + B tries; the others run on
    graph, personas = files
    data = tmp_path / "data"
    res = _tracedag("simulate", "--agent", "tests.replay.sim_agents:fails_on_zed", "--graph", graph,
                    "--personas", personas, "--max-backtracks", 2, "--max-visits", 1, "--data", data)
    assert res.returncode == 1, res.stdout + res.stderr  # the agent raised: those runs could not run
    # CCR: only i01 = 1/3; PCR: (1 + 1/2 + 0) / 3
    assert "CCR 33.3%, PCR 50.0% over 3 conversations (7 runs" in res.stdout
    assert "could not run usersim-seed7/c0/i03/plain/r2 (intent i03, persona plain): turn 1: RuntimeError: the " \
           "zed service is down" in res.stdout
    assert "0 of 7 runs failed, 3 could not run" in res.stdout
    errors = q(data, "select run_id, count(*) from spans where name = 'replay_error' group by all order by 1")
    assert errors == [(f"usersim-seed7/c0/i03/plain/r{i}", 1) for i in range(3)]


def test_ctrl_c_keeps_the_finished_conversations_and_exits_130(files, tmp_path):
    graph, personas = files
    data = tmp_path / "data"
    proc = subprocess.Popen([*CLI, "simulate", "--agent", "tests.replay.sim_agents:slow_wrong_branch",
                             "--graph", str(graph), "--personas", str(personas), "--max-visits", "1",
                             "--conversations", "40", "--data", str(data)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, "COLUMNS": "200"},
                            # a run started in the background of a script (nohup CMD &) inherits an ignored SIGINT:
                            # the simulation would never see the ctrl-c and run all 120 conversations
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not list(data.rglob("seg-*")):  # the first conversation's spans reached the in-process collector
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    time.sleep(2)  # the first conversations take 0.25-1.5 s each; all 120 about 90 s
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out + err
    match = re.search(r"interrupted: (\d+) of 120 conversations finished", out)
    assert match, out + err
    finished = int(match.group(1))
    assert 0 < finished < 120
    assert f"over {finished} conversations" in out
    assert "Traceback" not in err
    assert q(data, "select count(distinct run_id) from spans where run_id is not null")[0][0] >= finished


def _span(span_id, parent, node=None, start=0):
    return StoredSpan("t", span_id, parent, start, node)


def test_settled_needs_an_entry_span_and_no_missing_parent():
    local = {"L1"}
    assert not settled([], local)
    assert not settled([_span("L1", None)], local)  # only this process's own span
    assert not settled([_span("a", "L1"), _span("b", "zz")], local)  # b's parent not in yet
    assert not settled([_span("b", "a")], local)  # no entry span yet
    assert settled([_span("a", "L1"), _span("b", "a", "x")], local)


def test_remote_visits_keep_the_outermost_node_spans_of_the_agent():
    stored = [_span("L1", None), _span("a", "L1"), _span("n1", "a", "router", 10), _span("n2", "n1", "inner", 11),
              _span("n3", "a", "ask", 20), _span("n4", "LN", "nested", 30)]
    assert remote_visits(stored, {"L1", "LN"}, {"LN": 5}) == [(10, "n1", "router"), (20, "n3", "ask")]


def test_propagation_headers_carry_the_trace_and_the_labels_to_another_provider():
    sent = InMemorySpanExporter()
    td.configure(exporter=sent, set_global=False, schedule_delay_millis=10)
    try:
        with td.run_labels(run_id="r-1", scenario_id="s", replay_index=2), td.agent("caller") as step:
            headers = td.propagation_headers()
            trace_id = step.span.get_span_context().trace_id
    finally:
        td.shutdown()
    assert headers["traceparent"].split("-")[1] == f"{trace_id:032x}"
    assert "tracedag.run_id=r-1" in headers["baggage"]
    received = InMemorySpanExporter()  # the callee: its own provider, labels from the baggage
    td.configure(exporter=received, set_global=False, schedule_delay_millis=10)
    try:
        token = otel_context.attach(propagate.extract(headers))
        try:
            with td.node("router"):
                pass
        finally:
            otel_context.detach(token)
        assert td.force_flush()
    finally:
        td.shutdown()
    (span,) = received.get_finished_spans()
    assert span.context.trace_id == trace_id
    assert span.attributes["tracedag.run_id"] == "r-1"
    assert span.attributes["tracedag.replay_index"] == 2
    assert span.attributes["tracedag.scenario_id"] == "s"
