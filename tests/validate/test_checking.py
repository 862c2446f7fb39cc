"""Checking runs against a model: ordered subsequence, coverage, explanations, reports."""

from __future__ import annotations

import pytest

from tests.validate.validate_support import run
from tracedag.pipeline.validate.checking import WrongAgent, check_runs
from tracedag.pipeline.validate.learning import LearnOptions, learn_model

BOOKING = ("router", "ask_details", "check_availability", "propose_slot", "book_court", "finalize")


@pytest.fixture
def model():
    runs = [run(*BOOKING), run(*BOOKING),
            run("router", "ask_details", "ask_details", "check_availability", "propose_slot", "book_court", "finalize"),
            run("router", "ask_details", "check_availability", "book_court", "router", "finalize", passed=False)]
    return learn_model(runs, LearnOptions(state="node"), {})


def rows(model, *runs):
    return check_runs(list(runs), model, "m.json").to_pylist()


def test_learned_essential_states(model):
    assert model.scenarios["s"].essential == list(BOOKING)


def test_extra_and_repeated_states_are_noise(model):
    (r,) = rows(model, run("router", "club_info", "ask_details", "ask_details", "ask_details", "check_availability",
                           "propose_slot", "propose_slot", "book_court", "finalize"))
    assert r["passed"] is True and r["coverage"] == 1.0 and r["missing"] == [] and r["out_of_order"] == []
    assert r["explanation"] == "all 6 essential states reached in order"


def test_a_skipped_step_fails_and_is_named(model):
    (r,) = rows(model, run("router", "ask_details", "propose_slot", "book_court", "finalize"))
    assert r["passed"] is False
    assert r["missing"] == ["check_availability"]
    assert r["explanation"] == "State 'check_availability' never reached after 'ask_details'"
    assert r["coverage"] == pytest.approx(5 / 6) and r["matched_states"] == 5 and r["essential_states"] == 6


def test_several_missing_states_are_all_listed(model):
    (r,) = rows(model, run("router", "finalize"))
    assert r["missing"] == ["ask_details", "check_availability", "propose_slot", "book_court"]
    assert r["explanation"].startswith("State 'ask_details' never reached after 'router' (also missing: ")
    assert r["coverage"] == pytest.approx(2 / 6)


def test_states_out_of_order_fail_with_the_pair(model):
    (r,) = rows(model, run("router", "ask_details", "propose_slot", "check_availability", "book_court", "finalize"))
    assert r["passed"] is False and r["missing"] == []
    assert r["out_of_order"] == [{"expected_first": "check_availability", "expected_second": "propose_slot"}]
    assert r["explanation"] == "State 'propose_slot' reached before 'check_availability', which must come first"
    assert r["matched_states"] == 5  # the longest in-order match leaves one of the pair out


def test_failure_paths_and_slow_states_are_reported_without_failing(model):
    slow = run(*BOOKING, ms=5.0)  # learned visits took 1 ms; the bound is 2x
    (r,) = rows(model, slow)
    assert r["passed"] is True and len(r["too_slow"]) == 6
    assert r["too_slow"][0] == "'router' took 5.0 ms (learned bound 2.0 ms)"
    (r,) = rows(model, run(*BOOKING[:4], "book_court", "router", "finalize"))
    assert r["failure_paths"] == ["book_court -> router#2", "router#2 -> finalize"] and r["passed"] is True


def test_unknown_scenario_is_neither_pass_nor_fail(model):
    (r,) = rows(model, run(*BOOKING, scenario="other"))
    assert r["passed"] is None and r["coverage"] is None
    assert r["explanation"] == "no model for scenario 'other' (the model has s)"


def test_runs_of_another_agent_are_refused(model):
    with pytest.raises(WrongAgent, match="learned for agent 'ag'; the selected runs are of 'bot'"):
        rows(model, run(*BOOKING, agent="bot"))
    assert len(rows(model, run(*BOOKING, agent="bot"), run(*BOOKING))) == 1  # other agents' runs are skipped


def test_a_person_can_make_a_state_optional_or_essential(model):
    s = model.scenarios["s"]
    s.state("check_availability").essential = False
    (r,) = rows(model, run("router", "ask_details", "propose_slot", "book_court", "finalize"))
    assert r["passed"] is True
    s.state("ask_details#2").essential = True
    (r,) = rows(model, run(*BOOKING))
    assert r["missing"] == ["ask_details#2"]
