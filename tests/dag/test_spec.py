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


def test_an_agent_graph_is_the_spec(tmp_path):
    from tracedag.schemas.agent_graph import parse_graph

    graph = {
        "nodes": [{"name": "search", "match": {"step_type": "tool", "step_name": "search"}},
                  {"name": "tool", "match": {"step_type": "tool"}}, {"name": "answer"}],
        "edges": [{"source": "search", "target": "answer"}, {"source": "tool", "target": "answer"}],
        "start": ["search", "tool"], "terminals": ["answer"], "required": ["answer"],
    }
    path = tmp_path / "graph.yaml"  # YAML or JSON: the same document
    path.write_text(json.dumps(graph))
    spec = load_spec(path)
    assert spec.match("tool", "search") == "search" and spec.match("tool", "calc") == "tool"
    assert spec.match("llm", "answer") == "answer" and spec.match("llm", "plan") is None
    assert spec.deviation({"search"}, {("answer", "search")}) == "answer -> search not allowed; required answer missing"
    assert parse_graph(graph).to_dict()["required"] == ["answer"]  # round trip keeps the spec parts
    assert parse_graph(parse_graph(graph).to_dict()) == parse_graph(graph)


def test_a_retired_spec_is_converted_once_with_a_warning(tmp_path, caplog):
    legacy = {"nodes": {"search": {"step_type": "tool", "step_name": "search"}, "answer": None},
              "edges": [["search", "answer"]], "required": ["answer"]}
    path = tmp_path / "flow.yaml"
    path.write_text(json.dumps(legacy))
    with caplog.at_level("WARNING"):
        old = load_spec(path)
    converted = tmp_path / "flow.graph.json"
    assert "retired workflow-spec format" in caplog.text and str(converted) in caplog.text
    doc = json.loads(converted.read_text())
    assert doc["nodes"][0] == {"name": "search", "match": {"step_type": "tool", "step_name": "search"}}
    assert doc["start"] == ["search"] and doc["terminals"] == ["answer"] and doc["required"] == ["answer"]
    assert load_spec(converted) == old
