"""Hand-built traces, one per reconstruction case; expected results worked out by hand."""

import networkx as nx
import pytest

from tests.dag.spanbuild import Built, run, span


def check_invariants(b: Built) -> None:
    """Acyclic in the dependency direction, topo_index agrees with every edge, nested sets nest."""
    g = nx.DiGraph()
    g.add_nodes_from(b.nodes)
    g.add_edges_from((e["upstream_span_id"], e["downstream_span_id"]) for e in b.edges)
    assert nx.is_directed_acyclic_graph(g)
    for e in b.edges:
        up, down = b.nodes[e["upstream_span_id"]], b.nodes[e["downstream_span_id"]]
        assert up["topo_index"] < down["topo_index"], e
    for n in b.nodes.values():
        assert n["nested_left"] < n["nested_right"]
        if n["parent_span_id"]:
            p = b.nodes[n["parent_span_id"]]
            assert p["nested_left"] < n["nested_left"] and n["nested_right"] < p["nested_right"]
            assert n["depth"] == p["depth"] + 1
    for t in {n["trace_id"] for n in b.nodes.values()}:
        topo = sorted(n["topo_index"] for n in b.nodes.values() if n["trace_id"] == t)
        assert topo == list(range(len(topo)))


def test_sequential_chain():
    b = run([span("r", None, 0, 100), span("a", "r", 1, 10), span("b", "r", 11, 20), span("c", "r", 21, 30)])
    check_invariants(b)
    assert b.kind("sequence") == {("a", "b"), ("b", "c")}  # a -> c is implied, not kept
    assert b.kind("parent") == {("r", "a"), ("r", "b"), ("r", "c")}
    assert b.col("branch_id") == {"r": 0, "a": 0, "b": 0, "c": 0}
    assert b.topo_order() == ["a", "b", "c", "r"]
    assert b.trace["method"] == "inferred" and b.trace["connected"] and b.trace["root_span_id"] == "r"
    up = {(e["upstream_span_id"], e["downstream_span_id"]) for e in b.edges}
    assert ("a", "r") in up and ("a", "b") in up  # child -> parent, earlier -> later


def test_fork_join():
    b = run([
        span("r", None, 0, 100), span("a", "r", 0, 10), span("b", "r", 11, 20), span("c", "r", 11, 25),
        span("j", "r", 26, 30),
    ])
    check_invariants(b)
    assert b.kind("sequence") == {("a", "b"), ("a", "c"), ("b", "j"), ("c", "j")}
    br = b.col("branch_id")
    assert br["a"] == 0 and br["j"] == 0
    assert br["b"] > 0 and br["c"] > 0 and br["b"] != br["c"]


def test_nested_forks():
    b = run([
        span("r", None, 0, 100), span("a", "r", 0, 10),
        span("b", "r", 11, 40), span("b1", "b", 12, 20), span("b2", "b", 12, 22),
        span("c", "r", 11, 40), span("c1", "c", 12, 20), span("c2", "c", 21, 30),
        span("j", "r", 41, 50),
    ])
    check_invariants(b)
    br = b.col("branch_id")
    assert len({br["b"], br["c"], br["b1"], br["b2"]}) == 4 and 0 not in {br["b1"], br["b2"]}
    assert br["c1"] == br["c2"] == br["c"]  # a chain inside branch c stays on c
    assert br["j"] == 0
    assert b.kind("sequence") >= {("c1", "c2"), ("b", "j"), ("c", "j")}
    assert ("b1", "b2") not in b.kind("sequence")
    assert b.col("depth")["b2"] == 2


def test_retry_loop():
    b = run([
        span("r", None, 0, 100),
        span("s1", "r", 0, 10, name="search", status=2),
        span("s2", "r", 11, 20, name="search", status=2),
        span("s3", "r", 21, 30, name="search", status=1),
        span("ans", "r", 31, 40, name="answer"),
    ])
    check_invariants(b)
    assert [b.nodes[s]["iteration"] for s in ("s1", "s2", "s3")] == [1, 2, 3]
    assert [b.nodes[s]["is_retry"] for s in ("s1", "s2", "s3")] == [False, True, True]
    assert b.nodes["ans"]["iteration"] == 1 and not b.nodes["ans"]["is_retry"]
    assert b.nodes["s2"]["step_key"] == "r/search"
    assert b.trace["error_count"] == 2


def test_loop_with_parallel_body():
    b = run([
        span("r", None, 0, 100), span("plan", "r", 0, 5),
        span("w1", "r", 6, 10, name="worker"), span("v1", "r", 6, 12, name="verifier"),
        span("k1", "r", 13, 15, name="check"),
        span("w2", "r", 16, 20, name="worker"), span("v2", "r", 16, 19, name="verifier"),
        span("k2", "r", 21, 23, name="check"),
    ])
    check_invariants(b)
    it = b.col("iteration")
    assert (it["w1"], it["v1"], it["k1"], it["w2"], it["v2"], it["k2"]) == (1, 1, 1, 2, 2, 2)
    assert b.kind("sequence") == {
        ("plan", "w1"), ("plan", "v1"), ("w1", "k1"), ("v1", "k1"),
        ("k1", "w2"), ("k1", "v2"), ("w2", "k2"), ("v2", "k2"),
    }
    br = b.col("branch_id")
    assert br["k1"] == br["k2"] == 0 and len({br["w1"], br["v1"], br["w2"], br["v2"]}) == 4


def test_parallel_instances_of_one_step_share_an_iteration():
    b = run([
        span("r", None, 0, 100), span("t1", "r", 0, 10, name="tool"), span("t2", "r", 0, 12, name="tool"),
        span("t3", "r", 13, 20, name="tool"),
    ])
    assert b.col("iteration") == {"r": 1, "t1": 1, "t2": 1, "t3": 2}


def test_orphan_attached_by_time():
    b = run([
        span("r", None, 0, 100), span("a", "r", 10, 50), span("x", "ghost", 20, 30), span("y", "ghost", 60, 70),
    ])
    check_invariants(b)
    assert b.kind("orphan_attach") == {("a", "x"), ("r", "y")}  # the deepest span enclosing its start
    assert b.col("is_orphan") == {"r": False, "a": False, "x": True, "y": True}
    assert b.trace["orphan_count"] == 2 and b.trace["root_count"] == 1 and not b.trace["connected"]
    assert b.nodes["x"]["parent_span_id"] == "a" and b.nodes["x"]["depth"] == 2


def test_orphans_without_any_root_stay_roots():
    b = run([span("x", "ghost", 0, 10), span("y", "ghost", 20, 30)])
    check_invariants(b)
    assert b.trace["root_count"] == 2 and b.trace["orphan_count"] == 2
    assert b.kind("sequence") == {("x", "y")}
    assert b.trace["root_span_id"] == "x"


def test_multiple_roots():
    b = run([span("r1", None, 0, 10), span("c1", "r1", 1, 5), span("r2", None, 20, 30)])
    check_invariants(b)
    assert b.trace["root_count"] == 2 and not b.trace["connected"]
    assert b.kind("sequence") == {("r1", "r2")}
    assert b.trace["root_span_id"] == "r1"
    assert b.nodes["r2"]["nested_left"] > b.nodes["r1"]["nested_right"]


def test_child_starting_before_parent_is_shifted_and_flagged():
    b = run([span("r", None, 100, 200), span("c", "r", 90, 120), span("g", "c", 95, 100)])
    check_invariants(b)
    ms = 1_000_000
    c, g = b.nodes["c"], b.nodes["g"]
    assert c["clock_skew"] and not g["clock_skew"]
    assert c["start_time_unix_nano"] == b.nodes["r"]["start_time_unix_nano"]
    assert c["duration_ns"] == 30 * ms  # shifted, not shortened
    assert g["start_time_unix_nano"] - c["start_time_unix_nano"] == 5 * ms  # the subtree moves along
    assert b.trace["clock_skew_count"] == 1


def test_skew_within_tolerance_is_not_flagged():
    b = run([span("r", None, 100, 200), span("c", "r", 99.5, 120)], tolerance_ns=1_000_000)
    assert not b.nodes["c"]["clock_skew"]
    assert b.nodes["c"]["start_time_unix_nano"] == b.nodes["r"]["start_time_unix_nano"]


def test_identical_timestamps_are_concurrent():
    b = run([span("r", None, 0, 10), span("a", "r", 1, 1), span("b", "r", 1, 1), span("c", "r", 1, 1)])
    check_invariants(b)
    assert b.kind("sequence") == set()
    assert len({b.nodes[s]["branch_id"] for s in "abc"}) == 3
    assert sorted(b.nodes[s]["topo_index"] for s in "abc") == [0, 1, 2]


def test_small_overlap_within_tolerance_is_sequence():
    b = run([span("r", None, 0, 100), span("a", "r", 0, 10.5), span("b", "r", 10, 20)], tolerance_ns=1_000_000)
    assert b.kind("sequence") == {("a", "b")}
    b = run([span("r", None, 0, 100), span("a", "r", 0, 12), span("b", "r", 10, 20)], tolerance_ns=1_000_000)
    assert b.kind("sequence") == set()


def test_explicit_edge_contradicting_timestamps_wins():
    b = run([
        span("r", None, 0, 100),
        span("a", "r", 0, 10, node_execution_id="ex-a", previous_execution_id="ex-b"),
        span("b", "r", 20, 30, node_execution_id="ex-b"),
        span("c", "r", 40, 50),
    ])
    check_invariants(b)
    assert b.kind("explicit") == {("b", "a")}
    assert ("a", "b") not in b.kind("sequence")  # the timestamp order it contradicts is dropped
    assert b.trace["method"] == "explicit"
    assert b.nodes["b"]["topo_index"] < b.nodes["a"]["topo_index"]


def test_span_link_is_an_explicit_edge():
    link = {"trace_id": "t1", "span_id": "a", "trace_state": None, "attributes": []}
    other = {"trace_id": "t9", "span_id": "zz", "trace_state": None, "attributes": []}
    b = run([
        span("r", None, 0, 100), span("a", "r", 0, 10), span("m", "r", 0, 30),
        span("b", "r", 20, 30, links=[link, other]),
    ])
    check_invariants(b)
    assert b.kind("explicit") == {("a", "b")}
    assert ("a", "b") not in b.kind("sequence")


def test_graph_node_parent_is_an_explicit_edge():
    b = run([
        span("r", None, 0, 100),
        span("triage", "r", 0, 10, graph_node_id="triage"),
        span("billing", "r", 5, 30, graph_node_id="billing", graph_node_parent_id="triage"),
    ])
    check_invariants(b)
    assert b.kind("explicit") == {("triage", "billing")}


def test_langgraph_steps_order_siblings_against_timestamps():
    b = run([
        span("g", None, 0, 100),
        span("n1", "g", 50, 60, name="plan", langgraph_step=1, langgraph_node="plan"),
        span("n2", "g", 10, 20, name="act", langgraph_step=2, langgraph_node="act"),
        span("n3", "g", 5, 8, name="act", langgraph_step=2, langgraph_node="act"),
        span("llm", "n2", 11, 19, langgraph_step=2, langgraph_node="act", step_type="llm"),
        span("n4", "g", 70, 80, name="plan", langgraph_step=3, langgraph_node="plan"),
    ])
    check_invariants(b)
    assert b.kind("sequence") == {("n1", "n2"), ("n1", "n3"), ("n2", "n4"), ("n3", "n4")}
    assert b.trace["method"] == "explicit"
    it, br = b.col("iteration"), b.col("branch_id")
    assert (it["n1"], it["n4"], it["n2"], it["n3"]) == (1, 2, 1, 1)
    assert br["n2"] and br["n3"] and br["n2"] != br["n3"] and br["n1"] == 0
    assert br["llm"] == br["n2"]


def test_cycle_in_explicit_edges_falls_back_to_flat():
    b = run([
        span("r", None, 0, 100),
        span("a", "r", 0, 10, node_execution_id="ea", previous_execution_id="eb"),
        span("b", "r", 20, 30, node_execution_id="eb", previous_execution_id="ea"),
    ])
    check_invariants(b)
    assert b.trace["method"] == "flat" and "cycle" in b.trace["fallback_reason"]
    assert b.kind("sequence") == set() and b.kind("explicit") == set()
    assert b.kind("parent") == {("r", "a"), ("r", "b")}
    assert len(b.nodes) == 3


def test_parent_cycle_is_broken_and_flagged():
    b = run([span("r", None, 0, 100), span("a", "b", 10, 20), span("b", "a", 12, 18)])
    check_invariants(b)
    assert len(b.nodes) == 3
    assert sum(b.col("is_orphan").values()) == 1
    assert b.trace["orphan_count"] == 1


def test_self_parent_is_an_orphan():
    b = run([span("r", None, 0, 100), span("a", "a", 10, 20)])
    check_invariants(b)
    assert b.nodes["a"]["is_orphan"] and b.nodes["a"]["parent_span_id"] == "r"


def test_duplicate_spans_are_one_node_latest_wins():
    b = run([span("r", None, 0, 100), span("a", "r", 0, 10, received=1), span("a", "r", 0, 12, received=2)])
    assert len(b.nodes) == 2 and b.nodes["a"]["duration_ns"] == 12_000_000
    assert b.trace["last_received_unix_nano"] == 2


def test_many_traces_in_one_call_are_independent():
    rows = [span("r", None, 0, 100, trace_id="t1"), span("a", "r", 0, 10, trace_id="t1"),
            span("r2", None, 0, 100, trace_id="t2"), span("b", "r2", 0, 10, trace_id="t2"),
            span("c", "r2", 20, 30, trace_id="t2")]
    b = run(rows)
    check_invariants(b)
    assert [t["trace_id"] for t in b.traces] == ["t1", "t2"]
    assert [t["span_count"] for t in b.traces] == [2, 3]
    assert b.kind("sequence") == {("b", "c")}
    assert b.nodes["b"]["topo_index"] == 0 and b.nodes["a"]["topo_index"] == 0


def test_empty_input():
    b = run([])
    assert b.traces == [] and b.nodes == {} and b.edges == []


@pytest.mark.parametrize("end", [5, 0])
def test_end_before_start_is_clamped(end):
    b = run([span("r", None, 10, 100), span("a", "r", 10, end)])
    assert b.nodes["a"]["duration_ns"] == 0
