"""Workflow spec parsing and matching."""

import json

import pytest

from tracedag.pipeline.dag.spec import BadSpec, load_spec, parse_spec


def test_json_spec_matches_by_type_and_name(tmp_path):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({
        "nodes": {"search": {"step_type": "tool", "step_name": "search"}, "tool": {"step_type": "tool"},
                  "answer": None},
        "edges": [["search", "answer"], ["tool", "answer"]],
        "required": ["answer"],
    }))
    spec = load_spec(path)
    assert spec.match("tool", "search") == "search"  # first matching rule wins
    assert spec.match("tool", "calc") == "tool"
    assert spec.match("llm", "answer") == "answer"  # an empty rule matches the node's own name
    assert spec.match("llm", "plan") is None
    assert spec.deviation({"answer", "search"}, {("search", "answer")}) is None
    assert spec.deviation({"search"}, {("answer", "search")}) == "answer -> search not allowed; required answer missing"


def test_many_reasons_are_capped():
    spec = parse_spec({"nodes": {"a": {}, "b": {}}})
    reason = spec.deviation({"a", "b"}, {("a", "b"), ("b", "a"), ("a", "a"), ("b", "b")})
    assert reason is not None and reason.endswith("and 1 more")


@pytest.mark.parametrize("doc", [
    [],
    {"nodes": []},
    {"nodes": {"a": {"kind": "x"}}},
    {"nodes": {"a": {}}, "edges": [["a", "zzz"]]},
    {"nodes": {"a": {}}, "edges": [["a"]]},
    {"nodes": {"a": {}}, "required": ["b"]},
])
def test_malformed_specs_are_rejected(doc):
    with pytest.raises(BadSpec):
        parse_spec(doc)


def test_unreadable_spec(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text("nodes: {a: [unclosed\n")
    with pytest.raises(BadSpec):
        load_spec(path)
