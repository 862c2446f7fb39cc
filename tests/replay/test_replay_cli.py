"""``tracedag replay`` end to end: the example agent, module:function agents and an OpenAI-compatible endpoint
(the official openai client against a local scripted server). Exit codes, bad input, ctrl-c and an agent on the
openai client's own instrumentation run in real processes; replays that need only the command's work run in this
process through click's runner (``in_process``)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.dag.spanbuild import q
from tests.queries.rca_scenarios import ACROSS_TURNS, capture
from tests.realspans import chat_completion, fake_openai_server
from tests.replay.replay_support import BOOKING_TURNS, CLI, INFO_TURNS, example_store, in_process
from tracedag.pipeline.store.parquet import write_parquet_atomic
from tracedag.schemas.layout import table_dir

ROOT = Path(__file__).resolve().parents[2]


def _tracedag(*args, timeout=180, env=None):
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return example_store(tmp_path_factory.mktemp("src") / "data", {"c-book": BOOKING_TURNS, "c-info": INFO_TURNS})


def _copy(source, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(source, data)
    return data


def _source_rows(data):
    return q(data, "select trace_id, span_id, name, input_text from spans where run_id is null order by 1, 2")


def test_example_agent_replayed_three_times_labelled_and_the_printed_next_line_builds_and_reads_them(source, tmp_path):
    """Three labelled replays of one conversation; then the ``next:`` line runs verbatim (each ``&&`` part split as
    a shell would, this interpreter's tracedag for ``tracedag``, a data path a shell must quote): its build builds
    every replayed trace at once (no idle wait) and its determinism reads the three runs."""
    import shlex

    data = tmp_path / "my data"
    shutil.copytree(source, data)
    before = _source_rows(data)
    first_trace = q(data, "select arg_min(trace_id, start_time_unix_nano) from spans where conversation_id = 'c-book'")[0][0]
    res = in_process("replay", "--data", data, "--agent", "example", "--agent-opt", "fault_rate=0", "--agent-opt",
                     "noise=0", "--conversation", "c-book", "--times", "3", "--parallel", "2", "--replay-id", "rp1",
                     "--label", "service_version=candidate", "--label", "team=courts")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "3 of 3 runs finished, 0 failed, 0 could not run" in res.stdout
    runs = q(data, """select run_id, any_value(scenario_id), any_value(replay_index), any_value(variant_id),
                             any_value(service_version), any_value(conversation_id),
                             any_value(attributes['tracedag.source_trace_id']), any_value(attributes['tracedag.team']),
                             count(distinct trace_id)
                      from spans where run_id is not null group by run_id order by run_id""")
    assert runs == [(f"rp1/c-book/r{i}", "c-book", i, None, "candidate", f"rp1/c-book/r{i}", first_trace, "courts", 1)
                    for i in range(3)]
    turns = q(data, """select run_id, list(ev.attributes['content'] order by ev.time_unix_nano)
                       from (select run_id, unnest(events) as ev from spans where run_id is not null)
                       where ev.name = 'gen_ai.user.message' group by 1""")
    assert all(tuple(t) == BOOKING_TURNS for _, t in turns) and len(turns) == 3
    assert _source_rows(data) == before  # nothing stored is changed
    [line] = [x for x in res.stdout.splitlines() if x.startswith("next: ")]
    for part in line.removeprefix("next: ").split(" && "):
        words = shlex.split(part)
        assert words[0] == "tracedag", line
        done = in_process(*words[1:])
        assert done.returncode == 0, part + "\n" + done.stdout + done.stderr
    replayed = q(data, "select count(distinct trace_id) from spans where run_id like 'rp1/%'")[0][0]
    built = q(data, "select count(*) from traces where run_id like 'rp1/%'")[0][0]
    assert replayed == built == 3  # one trace per run
    [det] = sorted((data / "tables" / "determinism").glob("*.parquet"))  # determinism's default output
    rows = pq.read_table(det).to_pylist()
    [book] = [r for r in rows if r["scenario"] == "c-book"]
    assert (book["agent_version"], book["comparison"], book["runs"]) == ("candidate", "replays", 3)
    assert book["node_consistency"] == 1.0  # noise 0, no faults: the same path every time
    assert book["base_node_path"] == ["router", "ask_details", "ask_details", "check_availability",
                                      "propose_slot", "book_court", "finalize"]


def test_failing_runs_are_recorded_and_the_rest_continue(source, tmp_path):
    """An agent that fails again ran to its end: a result in the table, exit 0 (1 with --fail-on-failure)."""
    data = _copy(source, tmp_path)
    res = in_process("replay", "--data", data, "--agent", "example", "--agent-opt", "fault_rate=1",
                     "--times", "2", "--replay-id", "rp2")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "4 of 4 runs finished, 2 failed, 0 could not run" in res.stdout  # c-book needs the calendar
    assert "CalendarTimeout" in res.stdout or "CalendarUnavailable" in res.stdout
    errors = q(data, "select count(distinct run_id) from spans where run_id like 'rp2/c-book/%' and status_code = 2")
    assert errors == [(2,)]
    strict = _tracedag("replay", "--data", data, "--agent", "example", "--agent-opt", "fault_rate=1",
                       "--conversation", "c-book", "--replay-id", "rp3", "--fail-on-failure")
    assert strict.returncode == 1, strict.stdout + strict.stderr
    assert "1 of 1 runs finished, 1 failed, 0 could not run" in strict.stdout


def test_bad_input_gives_one_line_naming_the_problem(source, tmp_path):
    data = _copy(source, tmp_path)
    unknown = _tracedag("replay", "--data", data, "--agent", "example", "--conversation", "nope")
    assert unknown.returncode != 0 and "conversation nope: not found" in unknown.stderr
    broken = _tracedag("replay", "--data", data, "--agent", "no_such_module_19:agent")
    assert broken.returncode != 0 and "cannot import no_such_module_19" in broken.stderr
    opt = _tracedag("replay", "--data", data, "--agent", "example", "--agent-opt", "colour=red")
    assert opt.returncode != 0 and "colour" in opt.stderr
    for res in (unknown, broken, opt):
        assert "Traceback" not in res.stderr
    assert q(data, "select count(*) from spans where run_id is not null") == [(0,)]


@pytest.mark.parametrize("fn", ["echo", "echo_async"])
def test_module_function_agent_gets_the_history(source, tmp_path, fn):
    data = _copy(source, tmp_path)
    res = in_process("replay", "--data", data, "--agent", f"tests.replay.agents:{fn}", "--conversation", "c-book",
                     "--times", "2", "--replay-id", "rf")
    assert res.returncode == 0, res.stdout + res.stderr
    replies = q(data, """select output_text from spans where run_id = 'rf/c-book/r1' and step_type = 'agent'
                         order by start_time_unix_nano""")
    assert [r[0] for r in replies] == [f"{2 * i}: {t}" for i, t in enumerate(BOOKING_TURNS)]


def test_agent_that_raises_fails_its_run_only(source, tmp_path):
    data = _copy(source, tmp_path)
    res = _tracedag("replay", "--data", data, "--agent", "tests.replay.agents:breaks_on_second_turn",
                    "--replay-id", "rb")
    assert res.returncode == 1  # a run that could not run to its end
    assert "2 of 2 runs finished, 0 failed, 1 could not run" in res.stdout
    assert "could not run rb/c-book/r0 (conversation c-book): turn 2: RuntimeError: the agent lost its state" \
        in res.stdout
    # the agent recorded nothing for the failing turn: the replay's own error span shows the failed run
    errors = q(data, """select run_id, error_type, status_code from spans where name = 'replay_error'""")
    assert errors == [("rb/c-book/r0", "RuntimeError", 2)]


def _openai_store(tmp_path):
    three = next(s for s in ACROSS_TURNS if s.name == "x3-three-turns")
    data = tmp_path / "data"
    write_parquet_atomic(capture([three]), table_dir(data, "spans"))
    return data, three


def test_endpoint_agent_replays_an_openai_conversation(tmp_path):
    """The source conversation was held by an agent on the official openai client (openai-v2 spans, one
    trace per turn); it is replayed 3x against an OpenAI-compatible endpoint, the history sent each turn."""
    data, three = _openai_store(tmp_path)
    users = [t.user for t in three.turns]
    replies = [(200, chat_completion(f"reply {i}")) for i in range(9)]
    with fake_openai_server(replies) as srv:
        res = in_process("replay", "--data", data, "--agent", srv.base_url, "--agent-opt", "model=m-1",
                         "--times", "3", "--replay-id", "re")
        requests = list(srv.requests)
    assert res.returncode == 0, res.stdout + res.stderr
    assert len(requests) == 9 and all(r["model"] == "m-1" for r in requests)
    third = requests[2]["messages"]
    assert [m["role"] for m in third] == ["user", "assistant", "user", "assistant", "user"]
    assert [m["content"] for m in third if m["role"] == "user"] == users
    rows = q(data, """select scenario_id, count(distinct run_id), count(distinct trace_id), count(*)
                      from spans where run_id like 're/%' group by 1""")
    assert rows == [(three.conversation_id, 3, 9, 9)]  # one agent step per turn, one trace each


def test_endpoint_refusing_or_timing_out_fails_the_runs(tmp_path):
    data, three = _openai_store(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = _tracedag("replay", "--data", data, "--agent", f"http://127.0.0.1:{port}/v1", "--times", "2")
    assert res.returncode == 1  # the agent is unreachable: no run could run
    assert "2 of 2 runs finished, 0 failed, 2 could not run" in res.stdout
    assert "refused the connection" in res.stdout
    assert three.conversation_id in res.stdout


def test_ctrl_c_stops_cleanly_and_keeps_every_finished_run(source, tmp_path):
    import re
    import signal
    import time

    data = _copy(source, tmp_path)
    proc = subprocess.Popen([*CLI, "replay", "--data", str(data), "--agent", "example",
                             "--agent-opt", "latency_scale=20", "--times", "200", "--parallel", "2",
                             "--replay-id", "ci"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            # a run started in the background of a script (nohup CMD &) inherits an ignored SIGINT:
                            # the replay would never see the ctrl-c and finish all 400 runs
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    segments = len(list(data.rglob("seg-*")))
    deadline = time.monotonic() + 120
    while len(list(data.rglob("seg-*"))) == segments:  # the first replayed spans reached the collector
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    time.sleep(1)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out + err
    match = re.search(r"interrupted: (\d+) of 400 runs finished", out)
    assert match, out + err
    finished = int(match.group(1))
    assert 0 < finished < 400
    stored = q(data, "select count(distinct run_id) from spans where run_id like 'ci/%'")[0][0]
    assert stored == finished
    assert "Traceback" not in err


def test_openai_client_agent_replayed_with_its_own_instrumentation(tmp_path):
    """A module:function agent on the official openai client (openai-v2 instrumentation, plain OTel)
    replays an openai conversation 3x against a local chat-completions server: its chat spans carry
    the run labels, and determinism reads the replays."""
    data, three = _openai_store(tmp_path)
    with fake_openai_server([(200, chat_completion(f"reply {i}")) for i in range(9)]) as srv:
        res = _tracedag("replay", "--data", data, "--agent", "tests.replay.agents:openai_agent", "--times", "3",
                        "--replay-id", "ro", env={"FAKE_OPENAI_BASE_URL": srv.base_url,
                                                  "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "SPAN_ONLY",
                                                  "OTEL_SEMCONV_STABILITY_OPT_IN": "gen_ai_latest_experimental"})
        requests = list(srv.requests)
    assert res.returncode == 0, res.stdout + res.stderr
    assert len(requests) == 9
    assert [m["content"] for m in requests[2]["messages"] if m["role"] == "user"] == [t.user for t in three.turns]
    rows = q(data, """select run_id, scenario_id, replay_index, count(*), count(*) filter (where step_type = 'llm')
                      from spans where run_id like 'ro/%' group by all order by 1""")
    assert rows == [(f"ro/{three.conversation_id}/r{i}", three.conversation_id, i, 3, 3) for i in range(3)]
    # the replays' own user turns read back as the source's: a replay of a replay is the same conversation
    from tracedag.pipeline.replay.source import Selection, select_conversations

    [again] = select_conversations(data, Selection(conversations=("ro/" + three.conversation_id + "/r0",)))
    assert again.turns == tuple(t.user for t in three.turns)
    assert in_process("build", "--data", data).returncode == 0
    det = in_process("determinism", "--data", data, "--output", tmp_path / "det")
    assert det.returncode == 0, det.stderr
    rows = pq.read_table(tmp_path / "det" / "determinism.parquet").to_pylist()
    assert [r["runs"] for r in rows if r["scenario"] == three.conversation_id] == [3]
