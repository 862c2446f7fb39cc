"""Arguments the model made up (PARAMGEN), on conversations traced by REAL instrumentation: the model
step that emitted a call the tool rejected fails as ``invalid_tool_arguments`` and is the root cause;
a tool that fails on its own keeps the blame; the columnar pass still writes the reference's rows."""

from __future__ import annotations

import pytest

from tests.rca_agents import DIALECTS, load_case, paramgen_cases, trace_ids
from tests.score.test_columnar import assert_same_as_reference


@pytest.fixture(scope="module")
def cases():
    return paramgen_cases()


@pytest.fixture(scope="module")
def scored(cases, tmp_path_factory):
    """Every case of every dialect in ONE store, built, then scored by score_store and checked against the
    per-step reference (assert_same_as_reference): the store each test reads, with the scoring's counters."""
    data = tmp_path_factory.mktemp("paramgen") / "data"
    load_case(cases, data)
    return data, assert_same_as_reference(data)


@pytest.fixture(scope="module")
def roots(scored):
    """The store's root_causes rows (one per failed trace)."""
    from tracedag.pipeline.store.querying import run_named

    return run_named(scored[0], "root_causes").to_pylist()


def _flagged(data):
    from tracedag.pipeline.store.views import connect

    con = connect(data, shared_macros=False)  # views only, no query macro
    try:
        return con.execute("""
            select s.span_id, s.score, s.rule_name, s.explanation from step_scores s
            where s.taxonomy_l3 = 'invalid_tool_arguments'""").fetchall()
    finally:
        con.close()


def test_the_model_step_behind_each_rejected_call_fails_and_no_other(cases, scored):
    flagged = {r[0]: r for r in _flagged(scored[0])}
    made_up = {c.root_span_id for c in cases if c.made_up}
    # recovered: the model's first call was rejected too (then corrected): flagged, and only that call
    recovered = {c.dialect: c for c in cases if c.name == "recovered"}
    assert len(made_up) == 5 * len(DIALECTS)
    assert made_up <= set(flagged)
    assert len(set(flagged) - made_up) == len(recovered)
    for span_id in made_up:
        _, score, rule, explanation = flagged[span_id]
        assert rule == "emitted_invalid_arguments" and score <= 2
        assert explanation.startswith("the tool call it emitted had invalid arguments: lookup_weather")
    # arguments recorded as such (gen_ai.tool.call.arguments) that are not JSON score 1; OpenInference
    # records them as the tool's input, where the tool's JSONDecodeError tells (score 2)
    not_json = {c.dialect: flagged[c.root_span_id][1] for c in cases if c.name == "not-json"}
    assert not_json == {"openai-v2": 1.0, "openai-v2-no-content": 1.0, "openinference": 2.0}


@pytest.mark.parametrize("dialect", DIALECTS)
def test_the_model_step_is_the_root_cause_and_a_tool_fault_stays_the_tools(cases, dialect, roots):
    by_name = {c.name: c for c in cases if c.dialect == dialect}
    assert {"missing-field", "control-tool-fault", "recovered"} <= set(by_name)
    # every scenario: also where the model's next call (an apology) repeats its step key without
    # redoing the rejected call, which must not count as the model step's recovery. A case's answer is the
    # first root_causes row of its own traces (as rca_agents.analyse_together reads it), in the one store of
    # every case: one conversation's analysis leaking into another's shows as a wrong answer
    for name, case in sorted(by_name.items()):
        mine = [r["root_span_id"] for r in roots if r["trace_id"] in trace_ids(case)]
        assert (mine[0] if mine else None) == case.root_span_id, name


def test_columnar_pass_writes_the_reference_rows(scored):
    _, stats = scored  # assert_same_as_reference passed on the store (the fixture)
    assert stats.failures_by_category[("generation", "output_form", "invalid_tool_arguments")] == 6 * len(DIALECTS)
