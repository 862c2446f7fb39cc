"""The agent-graph DSL: validation errors that name the culprit, importers, the JSON Schema."""

from __future__ import annotations

import json
from importlib.resources import files
from typing import TypedDict

import jsonschema
import pytest

from tracedag.schemas.agent_graph import (
    GraphInvalid,
    from_langgraph,
    from_workflow_attributes,
    load_graph,
    parse_graph,
    save_graph,
)

SCHEMA = json.loads(files("tracedag.schemas").joinpath("agent_graph.schema.json").read_text())
EXAMPLE = json.loads(files("tracedag.schemas").joinpath("agent_graph.example.json").read_text())


def _g(**over):
    raw = {
        "nodes": [{"name": "a"}, {"name": "b"}],
        "edges": [{"source": "a", "target": "b"}],
        "start": "a",
        "terminals": ["b"],
    }
    raw.update(over)
    return raw


def test_example_validates_against_schema_and_parser():
    jsonschema.validate(EXAMPLE, SCHEMA)
    g = parse_graph(EXAMPLE)
    assert g.start == ("topic_selector",)
    assert g.allows("screening", "screening")
    assert not g.allows("screening", "job_inquiry")
    assert g.nodes[0].intents == ("greeting", "unclear request")


def test_round_trip(tmp_path):
    g = parse_graph(EXAMPLE)
    save_graph(g, tmp_path / "g.json")
    again = load_graph(tmp_path / "g.json")
    assert again == g
    jsonschema.validate(json.loads((tmp_path / "g.json").read_text()), SCHEMA)


@pytest.mark.parametrize(
    ("raw", "where", "reason"),
    [
        (_g(edges=[{"source": "a", "target": "zz"}]), "edge 'a' -> 'zz'", "unknown node 'zz'"),
        (_g(edges=[{"source": "qq", "target": "b"}]), "edge 'qq' -> 'b'", "unknown node 'qq'"),
        (_g(nodes=[{"name": "a"}, {"name": "a"}]), "node 'a'", "declared twice"),
        (_g(nodes=[{"name": "a"}, {"nam": "b"}]), "nodes[1]", "name must be"),
        (_g(nodes=[{"name": "a", "intent": []}, {"name": "b"}]), "node 'a'", "unknown key(s) intent"),
        (_g(nodes=[{"name": "a", "intents": "x"}, {"name": "b"}]), "node 'a'", "intents must be"),
        (_g(start="c"), "start", "unknown node 'c'"),
        (_g(terminals=[]), "terminals", "at least one"),
        (_g(edges=[{"source": "a", "target": "b", "condition": 3}]), "edge 'a' -> 'b'", "condition"),
        (_g(edges=[{"source": "a", "target": "b", "weight": 3}]), "edge 'a' -> 'b'", "unknown key(s) weight"),
        ({"nodes": [{"name": "a"}], "edges": []}, "graph", "missing 'start'"),
    ],
)
def test_validation_names_the_culprit(raw, where, reason):
    with pytest.raises(GraphInvalid) as err:
        parse_graph(raw)
    assert err.value.where == where
    assert reason in err.value.reason
    assert where in str(err.value)


def test_schema_rejects_what_the_parser_rejects():
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(_g(nodes=[{"name": "a", "intent": []}, {"name": "b"}]), SCHEMA)
    jsonschema.validate(_g(start=["a", "b"]), SCHEMA)
    assert parse_graph(_g(start=["a", "b"])).start == ("a", "b")


def test_id_is_an_alias_of_name():
    g = parse_graph(_g(nodes=[{"id": "a"}, {"name": "b"}]))
    assert g.node_names == ["a", "b"]


class _State(TypedDict):
    n: int


def _real_langgraph():
    from langgraph.graph import END, START, StateGraph

    g = StateGraph(_State)
    g.add_node("router", lambda s: s)
    g.add_node("lookup", lambda s: {"n": s["n"] + 1})
    g.add_node("answer", lambda s: s)
    g.add_edge(START, "router")
    g.add_conditional_edges("router", lambda s: "lookup" if s["n"] < 2 else "answer", ["lookup", "answer"])
    g.add_edge("lookup", "router")
    g.add_edge("answer", END)
    return g.compile()


def test_import_from_a_real_langgraph_graph():
    compiled = _real_langgraph()
    assert compiled.invoke({"n": 0}) == {"n": 2}
    g = from_langgraph(compiled.get_graph().to_json(), name="lg")
    assert g.node_names == ["router", "lookup", "answer"]
    assert g.start == ("router",)
    assert g.terminals == ("answer",)
    assert {(e.source, e.target) for e in g.edges} == {
        ("router", "lookup"), ("router", "answer"), ("lookup", "router")
    }
    assert all(e.condition for e in g.edges if e.source == "router")
    jsonschema.validate(g.to_dict(), SCHEMA)


def test_import_from_openllmetry_workflow_attributes():
    nodes = json.dumps(["agent", "tools"])
    edges = json.dumps(["__start__ -> agent", "agent -> tools", "tools -> agent", "agent -> __end__"])
    g = from_workflow_attributes(nodes, edges)
    assert g.node_names == ["agent", "tools"]
    assert g.start == ("agent",)
    assert g.terminals == ("agent",)
    assert g.allows("tools", "agent") and g.allows("agent", "tools")


def test_workflow_attributes_errors():
    with pytest.raises(GraphInvalid, match="gen_ai.workflow.nodes"):
        from_workflow_attributes("not json", "[]")
    with pytest.raises(GraphInvalid, match="cannot read edge"):
        from_workflow_attributes('["a"]', '["a to b"]')


def test_graph_for_picks_by_name_then_the_only_graph():
    from tracedag.schemas.agent_graph import graph_for

    a = parse_graph(_g(name="agent-a"))
    b = parse_graph(_g(name="agent-b"))
    assert graph_for([a, b], "agent-b") is b
    assert graph_for([a, b], "agent-c") is None
    assert graph_for([a], "agent-c") is a
    assert graph_for([], "agent-a") is None
