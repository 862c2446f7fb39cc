"""Two sides that are different agents: their agent steps compare under one key, so every metric pairs
(the demo's permissive vs constrained gate once failed on ``step_visits[agent=<name>]`` -1.00, a metric
keyed by a name only one side has)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tests.regress.regress_support import gate_store, half
from tracedag.pipeline.cli import cli
from tracedag.pipeline.regress.gate import AGENT_KEY


@pytest.fixture(scope="module")
def agents(tmp_path_factory):
    """Agents a and b behave the same; c fails half its tool calls; a2 is agent a again (another version)."""
    return gate_store(tmp_path_factory.mktemp("agents") / "data", {
        "a": {"agent": "bot-a"}, "b": {"agent": "bot-b"}, "c": {"agent": "bot-c", "fails": half},
        "a2": {"agent": "bot-a"},
    })


def _regress(data, base, cand):
    out = CliRunner().invoke(cli, ["regress", "--data", str(data), "--baseline", base, "--candidate", cand,
                                   "--format", "json", "--no-save"], catch_exceptions=False)
    return out.exit_code, json.loads(out.output)


def test_the_same_behaviour_under_another_agent_name_passes(agents):
    code, doc = _regress(agents, "agent_name=bot-a,service_version=a", "agent_name=bot-b")
    assert code == 0, [m for m in doc["metrics"] if m["status"] != "ok"]
    names = [m["metric"] for m in doc["metrics"]]
    assert not [n for n in names if "bot-" in n]  # no metric only one side can have
    visits = next(m for m in doc["metrics"] if m["metric"] == f"step_visits[agent={AGENT_KEY}]")
    assert (visits["baseline_mean"], visits["candidate_mean"], visits["pairs"]) == (1.0, 1.0, 16)  # 4 x 4 cases
    assert any("different agents (bot-a, bot-b)" in n for n in doc["notes"])


def test_a_real_difference_between_agents_still_fails(agents):
    code, doc = _regress(agents, "agent_name=bot-a,service_version=a", "agent_name=bot-c")
    assert code == 1
    failing = {m["metric"] for m in doc["metrics"] if m["status"] == "fail"}
    assert "pass_rate" in failing and not [n for n in failing if "bot-" in n]


def test_one_agent_in_two_versions_keeps_its_agent_name(agents):
    code, doc = _regress(agents, "service_version=a", "service_version=a2")
    assert code == 0
    names = [m["metric"] for m in doc["metrics"]]
    assert "step_visits[agent=invoke_agent bot-a]" in names and f"step_visits[agent={AGENT_KEY}]" not in names
    assert not any("different agents" in n for n in doc["notes"])


def test_the_demo_labels_its_gate_against_what_it_expects(agents):
    """``tracedag demo``'s line: an unexpected alert (a pass-rate drop, not determinism) is not 'as expected'."""
    from dataclasses import asdict

    from tracedag.pipeline.demo.stages import gate_summary
    from tracedag.pipeline.regress import RegressConfig, run_regress

    result = run_regress(agents, "agent_name=bot-a,service_version=a", "agent_name=bot-c", RegressConfig())
    rows = [asdict(m) for m in result.metrics]
    compared = sum(1 for r in rows if r["pairs"])
    fails = sum(1 for r in rows if r["status"] == "fail")
    summary = gate_summary(rows)
    assert summary.startswith(f"FAIL, {fails} of {compared} metrics compared on both sides regressed (")
    assert summary.endswith("expected: only a determinism drop") and "as expected" not in summary
    same = run_regress(agents, "agent_name=bot-a,service_version=a", "agent_name=bot-b", RegressConfig())
    assert gate_summary([asdict(m) for m in same.metrics]).startswith("PASS, 0 of ")
