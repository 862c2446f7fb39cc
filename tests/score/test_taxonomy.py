"""The taxonomy file (levels, definitions, examples, required coverage) and the rubric files."""

from __future__ import annotations

from tracedag.pipeline.score.judge.rubrics import JudgeInput, load_rubrics, system_prompt, user_prompt
from tracedag.pipeline.score.taxonomy import load_taxonomy, taxonomy_document


def test_three_levels_with_definitions_and_examples():
    doc = taxonomy_document()
    assert doc["version"]
    l1 = doc["categories"]
    l2 = [c2 for c1 in l1 for c2 in c1["children"]]
    l3 = [c3 for c2 in l2 for c3 in c2["children"]]
    assert (len(l1), len(l2)) == (5, 9) and 20 <= len(l3) <= 24
    for c in l1 + l2 + l3:
        assert c["definition"].strip(), c["id"]
    for c in l3:
        assert len(c["examples"]) >= 2, c["id"]
    assert len({c["id"] for c in l3}) == len(l3)


def test_required_coverage():
    tax = load_taxonomy()
    where = {k: (c.l1, c.l2) for k, c in tax.leaves.items()}
    # tool/API execution failures
    for l3 in ("timeout", "rate_limited", "http_error", "tool_not_found"):
        assert where[l3] == ("execution", "call_failure")
    assert where["malformed_arguments"] == where["hallucinated_arguments"] == ("execution", "parameter_error")
    assert where["wrong_tool"][1] == "tool_selection"
    assert where["missing_step"] == where["misordered_steps"] == ("planning", "plan_structure")
    assert where["context_truncated"] == where["forgotten_fact"] == ("context", "context_loss")
    assert {where[x][0] for x in ("unfaithful_output", "refusal", "format_violation")} == {"generation"}
    assert where["loop_limit_reached"][1] == where["repetitive_loop"][1] == "non_termination"
    assert where["connection_error"][0] == "infrastructure"
    assert tax.unclassified().l3 == "unclassified" and tax.classify("nonsense") is None


def test_rubrics_have_anchors_and_examples():
    rubrics = load_rubrics()
    assert set(rubrics) == {"llm", "tool", "agent", "chain", "retriever"}
    for group in rubrics.values():
        for r in group:
            assert r.version and sorted(r.anchors) == [1, 2, 3, 4, 5]
            assert len(r.examples) >= 3
            assert {e["score"] for e in r.examples} & {1, 2} and {e["score"] for e in r.examples} & {4, 5}
            prompt = system_prompt(r)
            assert r.anchors[1] in prompt and '"score"' in prompt
            assert all(c in prompt for c in r.failure_categories)


def test_user_prompt_shows_inputs_and_upstream_only():
    step = JudgeInput("llm", "chat", None, "ok", "Weather in Paris?", "12 C", (("tool get_weather", "12"),))
    text = user_prompt(step)
    assert "Weather in Paris?" in text and "- tool get_weather: 12" in text and text.endswith("12 C")
