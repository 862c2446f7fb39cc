"""Arguments the model made up (PARAMGEN), on conversations traced by REAL instrumentation: the model
step that emitted a call the tool rejected fails as ``invalid_tool_arguments`` and is the root cause;
a tool that fails on its own keeps the blame; the columnar pass still writes the reference's rows."""

from __future__ import annotations

import pytest

from tests.rca_agents import DIALECTS, analyse_together, load_case, paramgen_cases
from tests.score.test_columnar import assert_same_as_reference


@pytest.fixture(scope="module")
def cases():
    return paramgen_cases()


def _flagged(data):
    from tracedag.pipeline.store.views import connect

    con = connect(data, shared_macros=False)  # views only, no query macro
    try:
        return con.execute("""
            select s.span_id, s.score, s.rule_name, s.explanation from step_scores s
            where s.taxonomy_l3 = 'invalid_tool_arguments'""").fetchall()
    finally:
        con.close()


def test_the_model_step_behind_each_rejected_call_fails_and_no_other(cases, tmp_path):
    from tracedag.pipeline.score import score_store

    load_case(cases, tmp_path / "data")
    score_store(tmp_path / "data")
    flagged = {r[0]: r for r in _flagged(tmp_path / "data")}
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
def test_the_model_step_is_the_root_cause_and_a_tool_fault_stays_the_tools(cases, dialect, tmp_path):
    by_name = {c.name: c for c in cases if c.dialect == dialect}
    assert {"missing-field", "control-tool-fault", "recovered"} <= set(by_name)
    # every scenario: also where the model's next call (an apology) repeats its step key without
    # redoing the rejected call, which must not count as the model step's recovery
    names = sorted(by_name)
    got = analyse_together([by_name[n] for n in names], tmp_path / "data")  # one store: one build, one scoring
    for name, outcome in zip(names, got, strict=True):
        assert outcome.root_span_id == by_name[name].root_span_id, name


def test_columnar_pass_writes_the_reference_rows(cases, tmp_path):
    load_case(cases, tmp_path / "data")
    stats = assert_same_as_reference(tmp_path / "data")
    assert stats.failures_by_category[("generation", "output_form", "invalid_tool_arguments")] == 6 * len(DIALECTS)
