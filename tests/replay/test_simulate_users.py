"""``tracedag simulate --agent TARGET --graph GRAPH``: simulated users, backtracking, CCR and PCR (the example
agent, a module:function agent, a model user behind a local OpenAI-compatible server). The commands run in this
process through click's runner (``in_process``), except bad input, whose one-line stderr and exit code 2 are a
process's; a simulation as a process (its exit codes, ctrl-c, an agent behind a URL) is test_simulate_remote's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.dag.spanbuild import q
from tests.realspans import chat_completion, fake_openai_server
from tests.replay.replay_support import in_process, run_tracedag, sim_files  # noqa: F401  (the files fixture)
from tracedag.pipeline.demo.agent.booking_graph import agent_graph
from tracedag.pipeline.replay.simulation import progress_of

ROOT = Path(__file__).resolve().parents[2]
AGENT = "tests.replay.sim_agents:wrong_branch"


def _tracedag(*args, timeout=180):
    """``tracedag ARGS`` as a process of its own."""
    return run_tracedag(*args, timeout=timeout)


def _runs(data):
    return q(data, """select scenario_id, variant_id, count(distinct run_id), max(replay_index)
                      from spans where run_id is not null group by all order by 1""")


def test_progress_counts_transitions_until_the_first_unintended_one():
    assert progress_of(["r", "a", "x"], ["r", "a", "x"]) == (2, False)
    assert progress_of(["r", "a", "x"], ["r", "a", "y"]) == (1, True)
    assert progress_of(["r", "a"], ["r", "a", "y"]) == (1, False)
    assert progress_of(["q"], ["r", "a"]) == (0, True)
    assert progress_of([], ["r", "a"]) == (0, False)


def test_wrong_branch_gives_the_hand_worked_ccr_and_pcr_and_restarts_bounded_by_b(files, tmp_path):
    # i01 router>ask>x: completed first try (2 of 2 transitions); i02 router>ask>y: the agent
    # goes to x, 1 of 2 transitions each try, restarted B=2 times (3 runs); i03 router>z: completed.
    # CCR = 2/3 = 66.7 %, PCR = (1 + 1/2 + 1) / 3 = 83.3 %.
    graph, personas = files
    data = tmp_path / "data"
    res = in_process("simulate", "--agent", AGENT, "--graph", graph, "--personas", personas, "--max-backtracks", 2,
                     "--data", data, "--max-visits", 1)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "CCR 66.7%, PCR 83.3% over 3 conversations (5 runs" in res.stdout
    assert _runs(data) == [("i01", "plain", 1, 0), ("i02", "plain", 3, 2), ("i03", "plain", 1, 0)]
    paths = q(data, """select distinct scenario_id, attributes['tracedag.intended_path'] from spans
                       where run_id is not null order by 1""")
    assert paths[1] == ("i02", json.dumps(["router", "ask", "y"]))


def test_no_backtracks_holds_one_run_per_conversation(files, tmp_path):
    graph, personas = files
    data = tmp_path / "data"
    res = in_process("simulate", "--agent", AGENT, "--graph", graph, "--personas", personas, "--max-backtracks", 0,
                     "--conversations", 2, "--data", data, "--max-visits", 1)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "CCR 66.7%, PCR 83.3% over 6 conversations (6 runs" in res.stdout
    assert [r[2:] for r in _runs(data)] == [(2, 0), (2, 0), (2, 0)]


def test_example_agent_on_its_bundled_graph_completes_every_path_and_determinism_reads_the_runs(tmp_path):
    graph = tmp_path / "booking.json"
    graph.write_text(json.dumps(agent_graph("constrained")))
    assert in_process("graph", "validate", graph).returncode == 0
    data = tmp_path / "data"
    res = in_process("simulate", "--agent", "example", "--graph", graph, "--agent-opt", "fault_rate=0",
                     "--agent-opt", "noise=0", "--persona", "terse", "--persona", "rude", "--data", data)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "CCR 100.0%, PCR 100.0% over 10 conversations (10 runs" in res.stdout  # 5 paths x 2 personas
    runs = _runs(data)
    assert {r[0] for r in runs} == {f"i0{i}" for i in range(1, 6)}
    assert {r[1] for r in runs} == {"terse", "rude"}
    assert in_process("build", "--data", data).returncode == 0
    det = in_process("determinism", "--data", data)
    assert det.returncode == 0, det.stdout + det.stderr
    assert "court_booking.constrained" in det.stdout


def test_a_model_plays_the_user_with_the_persona_prompt_and_temperature(files, tmp_path):
    graph, personas = files
    replies = [(200, chat_completion(t)) for t in ("details please", "x, thanks", "details please", "y!", "zed now")]
    with fake_openai_server(replies) as server:
        res = in_process("simulate", "--agent", AGENT, "--graph", graph, "--personas", personas,
                         "--max-backtracks", 0, "--data", tmp_path / "data", "--max-visits", 1,
                         "--user-model", "user-llm", "--user-base-url", server.base_url)
        requests = list(server.requests)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "CCR 66.7%, PCR 83.3% over 3 conversations (3 runs" in res.stdout
    assert len(requests) == 5  # one per user turn: 2 + 2 + 1
    assert all(r["model"] == "user-llm" and r["temperature"] == 0.3 for r in requests)
    assert "You say it plainly." in requests[0]["messages"][0]["content"]
    assert "went to ask" in json.dumps(requests[1]["messages"])  # the second turn sees the agent's reply
    assert "just zed" in requests[4]["messages"][-1]["content"]


@pytest.mark.parametrize("case, message", [
    ("graph", "agent graph"),
    ("persona", "--persona nobody: unknown persona"),
    ("agent", "cannot import no_such_module"),
])
def test_bad_input_is_one_line_and_exit_2(files, tmp_path, case, message):
    graph, personas = files
    args = ["simulate", "--agent", AGENT, "--graph", graph, "--data", tmp_path / "data"]
    if case == "graph":
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps({"nodes": [{"name": "a"}], "edges": [{"source": "a", "target": "b"}],
                                   "start": "a", "terminals": ["a"]}))
        args[4] = bad
    elif case == "persona":
        args += ["--persona", "nobody"]
    else:
        args[2] = "no_such_module:agent"
    res = _tracedag(*args)
    assert res.returncode == 2, res.stdout + res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], res.stderr
    assert not (tmp_path / "data").exists() or not any((tmp_path / "data").rglob("*.parquet"))


def test_graph_example_is_the_bundled_designed_graph(tmp_path):
    res = in_process("simulate", "--agent", "example", "--graph", "example", "--agent-opt", "fault_rate=0",
                     "--agent-opt", "noise=0", "--persona", "chatty", "--max-visits", 1, "--data", tmp_path / "data")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "CCR 100.0%, PCR 100.0% over 3 conversations (3 runs" in res.stdout  # 3 simple paths


def test_an_agent_without_node_spans_completes_nothing_and_says_why(files, tmp_path):
    graph, personas = files
    res = in_process("simulate", "--agent", "tests.replay.agents:echo", "--graph", graph, "--personas", personas,
                     "--max-backtracks", 1, "--max-visits", 1, "--data", tmp_path / "data")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "CCR 0.0%, PCR 0.0% over 3 conversations (6 runs" in res.stdout
    assert "warning: no node span was seen" in res.stdout
