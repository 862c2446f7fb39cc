"""Ground truth from a real LangGraph run traced by openinference-instrumentation-langchain.

The graph (tests/realspans.py) has a router, a tool node in an agent/tool loop, a ``Send`` fan-out
of three ``write_section`` tasks and a validator/fixer loop. LangGraph's own debug stream records
each task's super-step; the reconstructed DAG must agree with it: order, loop iterations, branches.
"""

import json

import pytest

from tests.realspans import langgraph_spans, to_table
from tracedag.pipeline.dag.reconstruct import reconstruct


@pytest.fixture(scope="module")
def run():
    cap = langgraph_spans()
    spans = to_table(cap.spans)
    traces, nodes, edges = reconstruct(spans, "b", 1)
    task_of = {}
    for r in spans.select(["span_id", "attributes"]).to_pylist():
        meta = json.loads(dict(r["attributes"]).get("metadata", "{}"))
        ns = meta.get("langgraph_checkpoint_ns", "")
        task_of[r["span_id"]] = ns.split(":")[-1]
    return cap, traces.to_pylist(), nodes.to_pylist(), edges.to_pylist(), task_of


def node_spans(run):
    """The spans of LangGraph tasks: children of the graph root, keyed by span id -> (step, node)."""
    cap, traces, nodes, _, task_of = run
    root = traces[0]["root_span_id"]
    truth = {s["task_id"]: (s["step"], s["node"]) for s in cap.steps}
    out = {n["span_id"]: truth[task_of[n["span_id"]]] for n in nodes if n["parent_span_id"] == root}
    assert len(out) == len(cap.steps) == 10  # every task is one node span
    return out


def test_one_trace_explicit_and_connected(run):
    _, traces, nodes, _, _ = run
    assert len(traces) == 1
    t = traces[0]
    assert t["method"] == "explicit" and t["connected"] and t["orphan_count"] == 0
    assert t["span_count"] == len(nodes)


def test_order_equals_langgraph_steps(run):
    _, _, nodes, edges, _ = run
    tasks = node_spans(run)
    steps = sorted({s for s, _ in tasks.values()})
    nxt = {a: b for a, b in zip(steps, steps[1:], strict=False)}
    expected = {(u, v) for u in tasks for v in tasks if nxt.get(tasks[u][0]) == tasks[v][0]}
    seq = {(e["src_span_id"], e["dst_span_id"]) for e in edges if e["edge_kind"] == "sequence"}
    assert {(u, v) for u, v in seq if u in tasks} == expected
    topo = {n["span_id"]: n["topo_index"] for n in nodes}
    for u in tasks:
        for v in tasks:
            if tasks[u][0] < tasks[v][0]:
                assert topo[u] < topo[v]


def test_loop_iterations_equal_langgraph_steps(run):
    _, _, nodes, _, _ = run
    tasks = node_spans(run)
    by_span = {n["span_id"]: n for n in nodes}
    for sid, (step, node) in tasks.items():
        steps_of_node = sorted({s for s, nd in tasks.values() if nd == node})
        assert by_span[sid]["iteration"] == steps_of_node.index(step) + 1, (node, step)
        assert by_span[sid]["step_name"] == node
    agent = sorted(by_span[s]["iteration"] for s, (_, nd) in tasks.items() if nd == "agent")
    validator = sorted(by_span[s]["iteration"] for s, (_, nd) in tasks.items() if nd == "validator")
    assert agent == [1, 2] and validator == [1, 2]


def test_parallel_branches_equal_send_fanout(run):
    _, _, nodes, _, _ = run
    tasks = node_spans(run)
    by_span = {n["span_id"]: n for n in nodes}
    for sid, (step, _) in tasks.items():
        same_step = [s for s, (st, _) in tasks.items() if st == step]
        assert (by_span[sid]["branch_id"] > 0) == (len(same_step) > 1)
    fan = [by_span[s]["branch_id"] for s, (_, nd) in tasks.items() if nd == "write_section"]
    assert len(fan) == 3 and len(set(fan)) == 3
    # the LLM call inside each write_section task stays on its task's branch
    for n in nodes:
        if n["parent_span_id"] in tasks and tasks[n["parent_span_id"]][1] == "write_section":
            assert n["branch_id"] == by_span[n["parent_span_id"]]["branch_id"]
