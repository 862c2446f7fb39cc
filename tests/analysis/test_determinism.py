"""Determinism metrics: every worked example of the issue, ties, single runs, empty lists, variants."""

from __future__ import annotations

import pytest

from tracedag.pipeline.analysis.determinism import analyze_runs
from tracedag.pipeline.analysis.trajectories import Run

_n = iter(range(10_000))


def run(nodes=(), actions=(), inputs=None, variant=None, scenario="s", agent="ag", response=None, replay=None):
    i = next(_n)
    r = Run(run_key=f"r{i:04d}", agent=agent, agent_version=None, scenario=scenario, variant_id=variant,
            replay_index=replay if replay is not None else i, start_ns=i)
    r.nodes = list(nodes)
    r.node_failed = [False] * len(r.nodes)
    r.node_turn = [0] * len(r.nodes)
    r.actions = list(actions)
    r.action_inputs = list(inputs if inputs is not None else actions)
    r.responses = [response]
    r.trace_ids = [f"t{i}"]
    return r


def det(runs, comparison="replays", **kw):
    rows = analyze_runs(runs, **kw).tables["determinism"].to_pylist()
    return next(r for r in rows if r["comparison"] == comparison)


def test_node_consistency_worked_example():
    # (A->B), (A->B->A), (A->B) -> 2/3
    row = det([run("AB"), run("ABA"), run("AB")])
    assert row["node_consistency"] == pytest.approx(2 / 3)
    assert row["base_node_path"] == ["A", "B"]
    assert row["runs"] == 3


def test_node_coverage_worked_example():
    # {A,B} three times -> 1 (the sets are equal although the paths differ)
    row = det([run("AB"), run("ABA"), run("BA")])
    assert row["node_coverage"] == pytest.approx(1.0)


def test_action_input_worked_example():
    # KB(q=X)->CRM(p=A) twice and KB(q=Y)->CRM(p=B) once -> consistency 2/3, coverage 1/3
    x = ["KB(q=X)", "CRM(p=A)"]
    y = ["KB(q=Y)", "CRM(p=B)"]
    row = det([run(actions=["KB", "CRM"], inputs=x), run(actions=["KB", "CRM"], inputs=x),
               run(actions=["KB", "CRM"], inputs=y)])
    assert row["action_input_consistency"] == pytest.approx(2 / 3)
    assert row["action_input_coverage"] == pytest.approx(1 / 3)
    assert row["action_consistency"] == pytest.approx(1.0)
    assert row["action_coverage"] == pytest.approx(1.0)


def test_partial_overlap_coverage():
    # {A,B} vs {B,C}: 1/3; {A,B} vs {A,B}: 1; {B,C} vs {A,B}: 1/3 -> mean 5/9
    row = det([run("AB"), run("BC"), run("AB")])
    assert row["node_coverage"] == pytest.approx(5 / 9)


def test_modal_tie_goes_to_shorter_then_smaller_path():
    row = det([run("AB"), run("C")])
    assert row["base_node_path"] == ["C"]
    assert row["node_consistency"] == pytest.approx(0.5)
    row = det([run("B"), run("A")])
    assert row["base_node_path"] == ["A"]
    # the choice does not depend on the order of the runs
    assert det([run("A"), run("B")])["base_node_path"] == ["A"]


def test_single_run():
    row = det([run("ABC", actions=["t"])])
    assert row["node_consistency"] == 1.0
    assert row["node_coverage"] == 1.0
    assert row["action_coverage"] == 1.0
    assert row["response_consistency"] is None  # no response at all
    assert det([run("A", response="ok")])["response_consistency"] == 4.0


def test_empty_tool_lists():
    # no run called a tool: every run has the same (empty) action path; empty sets are identical
    row = det([run("AB"), run("AB"), run("A")])
    assert row["action_consistency"] == 1.0
    assert row["action_coverage"] == 1.0
    assert row["base_action_path"] == []
    # one run with a tool, two without: modal is the empty path, consistency 2/3;
    # pairs: (empty, empty) = 1, (empty, {t}) = 0 twice -> 1/3
    row = det([run("A"), run("A"), run("A", actions=["t"])])
    assert row["action_consistency"] == pytest.approx(2 / 3)
    assert row["action_coverage"] == pytest.approx(1 / 3)


def test_variants_against_the_base_path():
    runs = [run("AB"), run("AB"), run("AC"),  # base path A->B
            run("AB", variant="v1"), run("ABD", variant="v2"), run("AC", variant="v2")]
    row = det(runs, "variants")
    assert row["runs"] == 3
    assert row["variants"] == 2
    assert row["node_consistency"] == pytest.approx(1 / 3)
    # Jaccard with {A,B}: {A,B} 1, {A,B,D} 2/3, {A,C} 1/3 -> mean 2/3
    assert row["node_coverage"] == pytest.approx(2 / 3)
    assert row["reason"] is None
    assert det(runs)["runs"] == 3  # replays are counted apart


def test_variants_without_base():
    row = det([run("AB", variant="v1"), run("AB", variant="v2")], "variants")
    assert row["node_consistency"] is None
    assert row["node_coverage"] is None
    assert row["response_consistency"] is None
    assert row["reason"] == "no exact replays (no base path)"


def test_groups_by_agent_and_scenario():
    runs = [run("AB", scenario="s1"), run("AB", scenario="s1"), run("AC", scenario="s2"),
            run("AB", scenario="s1", agent="other")]
    rows = analyze_runs(runs).tables["determinism"].to_pylist()
    assert [(r["agent"], r["scenario"], r["runs"]) for r in rows] == [
        ("ag", "s1", 2), ("ag", "s2", 1), ("other", "s1", 1)
    ]
    per_agent = analyze_runs(runs).tables["determinism_agent"].to_pylist()
    ag = next(r for r in per_agent if r["agent"] == "ag")
    assert ag["scenarios"] == 2 and ag["runs"] == 3


def test_offline_response_consistency_is_labelled():
    row = det([run("A", response="the court is booked"), run("A", response="the court is booked")])
    assert row["response_consistency"] == 4.0
    assert row["response_consistency_method"] == "token_jaccard_offline"
    # {a b} vs {a c}: J = 1/3 -> 1 + 3 * 1/3 = 2
    row = det([run("A", response="a b"), run("A", response="A, c!")])
    assert row["response_consistency"] == pytest.approx(2.0)


def test_offline_variant_response_consistency_averages_over_variants():
    runs = [run("A", response="x y", replay=1), run("A", response="z", replay=0),
            run("A", variant="v", response="z"), run("A", variant="w", response="z q")]
    row = det(runs, "variants")
    # each variant with each exact replay ("x y", "z"): "z" -> 1 and 4, "z q" -> 1 and 1 + 3/2 = 2.5;
    # mean (1 + 4 + 1 + 2.5) / 4
    assert row["response_consistency"] == pytest.approx(2.125)
