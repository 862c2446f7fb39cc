"""Learning skeletons: prefix tree, conservative merging, dominators, outliers, bad input."""

from __future__ import annotations

import pytest

from tests.validate.validate_support import run
from tracedag.pipeline.validate.learning import (
    ACCEPT,
    START,
    AgentUnclear,
    LearnOptions,
    TooFewRuns,
    dominators_of_accept,
    learn_model,
    learn_skeleton,
    merge_tree,
    normalize,
    prefix_tree,
)

NODE = LearnOptions(state="node")


def essential(*runs, merge="normalized"):
    return learn_skeleton(runs, "node", merge).essential


def test_prefix_tree_has_one_node_per_distinct_prefix():
    tree, accepting = prefix_tree([["a", "b", "c"], ["a", "b", "d"], ["a", "x"]])
    # (), a, ab, abc, abd, ax
    assert tree.number_of_nodes() == 6
    assert len(accepting) == 3


def test_merged_graph_has_a_single_accepting_state():
    tree, accepting = prefix_tree([["a", "b"], ["a", "c"]])
    g = merge_tree(tree, accepting)
    assert set(g.nodes) == {START, ACCEPT, "a", "b", "c"}
    assert set(g.predecessors(ACCEPT)) == {"b", "c"}
    assert dominators_of_accept(g) == ["a"]


def test_states_every_run_passes_in_the_same_order_are_essential():
    # A B C D and A X C D: B and X are alternatives (optional), A C D dominate acceptance
    assert essential(run("A", "B", "C", "D"), run("A", "X", "C", "D")) == ["A", "C", "D"]


def test_states_visited_in_either_order_become_optional():
    # A B S C and A S B C: the merged graph has A -> B -> C, so S can be skipped (and B too)
    assert essential(run("A", "B", "S", "C"), run("A", "S", "B", "C")) == ["A", "C"]


def test_loop_visits_are_numbered_so_a_second_pass_is_its_own_state():
    sk = learn_skeleton([run("R", "ask", "ask", "C"), run("R", "ask", "C")], "node", "normalized")
    assert sk.essential == ["R", "ask", "C"]
    assert "ask#2" in sk.states and sk.support["ask#2"] == 1


def test_normalizing_merges_names_that_differ_in_ids_numbers_and_dates():
    assert normalize("fetch_order_1234") == "fetch_order_<n>"
    assert normalize("lookup 2026-12-02T10:00:00Z") == "lookup <date>"
    assert normalize("call_7f3a9c2e11") == "call_<id>"
    assert normalize("step-3fa85f64-5717-4562-b3fc-2c963f66afa6") == "step-<id>"
    runs = [run("R", "fetch_order_12", "F"), run("R", "fetch_order_99", "F")]
    assert essential(*runs) == ["R", "fetch_order_<n>", "F"]
    assert essential(*runs, merge="exact") == ["R", "F"]


def test_a_lone_passing_run_that_skipped_states_is_left_out():
    good = [run("R", "A", "B", "F") for _ in range(4)]
    wrong = run("R", "F")  # routed straight to the end without an error: passing, but a mistake
    model = learn_model([*good, wrong], NODE, {})
    s = model.scenarios["s"]
    assert s.essential == ["R", "A", "B", "F"]
    assert [x["run"] for x in s.excluded_runs] == [wrong.run_key]
    assert "lacks 'A', 'B'" in s.excluded_runs[0]["reason"]
    kept = learn_model([*good, wrong], LearnOptions(state="node", keep_outliers=True), {})
    assert kept.scenarios["s"].essential == ["R", "F"]


def test_two_runs_that_agree_on_a_variation_are_not_outliers():
    runs = [run("R", "A", "F"), run("R", "A", "F"), run("R", "A", "F"), run("R", "F"), run("R", "F")]
    s = learn_model(runs, NODE, {}).scenarios["s"]
    assert s.excluded_runs == [] and s.essential == ["R", "F"]


def test_failed_runs_are_not_learned_from_but_give_failure_transitions():
    runs = [run("R", "A", "F"), run("R", "A", "F"), run("R", "B", "F", passed=False)]
    s = learn_model(runs, NODE, {}).scenarios["s"]
    assert s.runs == [runs[0].run_key, runs[1].run_key]
    assert {(t["from"], t["to"]) for t in s.failure_transitions} == {("R", "B"), ("B", "F")}


def test_too_few_passing_runs_names_the_scenario_and_counts():
    runs = [run("R", "F", scenario="ok"), run("R", "F", scenario="ok"),
            run("R", "F", scenario="thin"), run("R", "F", scenario="thin", passed=False)]
    with pytest.raises(TooFewRuns) as e:
        learn_model(runs, NODE, {})
    assert "scenario thin: 1 passing of 2 run(s)" in str(e.value)
    assert "need 2" in str(e.value) and "scenario ok" not in str(e.value)


def test_runs_of_several_agents_need_a_choice():
    runs = [run("R", agent="a"), run("R", agent="a"), run("R", agent="b"), run("R", agent="b")]
    with pytest.raises(AgentUnclear, match="2 agents \\(a, b\\): choose one with --agent"):
        learn_model(runs, NODE, {})
    assert learn_model(runs, LearnOptions(state="node", agent="b"), {}).agent == "b"
    with pytest.raises(AgentUnclear, match="no run of agent 'c'"):
        learn_model(runs, LearnOptions(state="node", agent="c"), {})


def test_relearning_keeps_a_persons_edits():
    runs = [run("R", "A", "F"), run("R", "A", "F")]
    old = learn_model(runs, NODE, {})
    old.scenarios["s"].state("A").essential = False  # a person relaxed A
    new = learn_model([*runs, run("R", "A", "F")], NODE, {}, previous=old)
    assert new.scenarios["s"].essential == ["R", "F"]
    assert new.scenarios["s"].state("A").learned == "essential"


def test_step_key_states_name_tools_under_their_node():
    r = run("router", "check", "tool:calendar_search")
    r.steps[2] = type(r.steps[2])("tool", "calendar_search", "tool", "ag/check/calendar_search", 0, 1)
    sk = learn_skeleton([r, r], "step_key", "exact")
    assert sk.essential == ["router", "check", "check/calendar_search"]
    assert learn_skeleton([r, r], "step_type:step_name", "exact").essential[-1] == "tool:calendar_search"
    assert learn_skeleton([r, r], "tool", "exact").essential == ["calendar_search"]


def test_thin_scenarios_can_be_left_out_and_listed():
    runs = [run("R", "F", scenario="ok"), run("R", "F", scenario="ok"), run("R", "F", scenario="thin", passed=False)]
    model = learn_model(runs, LearnOptions(state="node", skip_thin=True), {})
    assert list(model.scenarios) == ["ok"]
    assert model.learned_from["skipped_scenarios"] == [{"scenario": "thin", "passing_runs": 0, "runs": 1}]
    with pytest.raises(TooFewRuns):  # nothing left to learn from at all
        learn_model(runs[2:], LearnOptions(state="node", skip_thin=True), {})
