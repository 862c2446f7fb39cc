"""Hypothesis: the instance graph is acyclic, every span is a node, and the result depends neither on
the order of the input rows nor on how a trace was split into batches (duplicates included)."""

import networkx as nx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.dag.spanbuild import Built, span, table
from tests.dag.test_cases import check_invariants
from tracedag.pipeline.dag.reconstruct import reconstruct
from tracedag.schemas.spans import SPANS_V1


@st.composite
def traces(draw):
    """1-3 traces of up to 14 spans: random trees, coarse times (ties, overlaps, skew), orphans, explicit edges."""
    rows = []
    for t in range(draw(st.integers(1, 3))):
        n = draw(st.integers(1, 14))
        names = draw(st.lists(st.sampled_from(["plan", "act", "tool", "check"]), min_size=n, max_size=n))
        for i in range(n):
            parent = None if i == 0 else f"s{draw(st.integers(0, i - 1))}"
            if i and draw(st.integers(0, 9)) == 0:
                parent = draw(st.sampled_from([None, "ghost"]))  # extra root or orphan
            start = draw(st.integers(0, 12))
            extra = {}
            if draw(st.booleans()):  # LangGraph super-steps on some spans: step order where a group has them all
                extra.update(langgraph_step=draw(st.integers(0, 3)), langgraph_node=names[i])
            if draw(st.integers(0, 7)) == 0 and i:
                extra["previous_execution_id"] = f"e{t}-{draw(st.integers(0, n - 1))}"
            rows.append(span(f"s{i}", parent, start, start + draw(st.integers(0, 6)), name=names[i],
                             trace_id=f"t{t}", status=draw(st.sampled_from([0, 0, 1, 2])),
                             node_execution_id=f"e{t}-{i}", **extra))
    return rows


def canonical(tables):
    traces, nodes, edges = tables
    node_rows = sorted(tuple(sorted((k, v) for k, v in r.items() if k != "build_id")) for r in nodes.to_pylist())
    edge_rows = sorted(tuple(sorted((k, v) for k, v in r.items() if k != "build_id")) for r in edges.to_pylist())
    skip = {"build_id", "last_received_unix_nano"}
    trace_rows = sorted(tuple(sorted((k, v) for k, v in r.items() if k not in skip)) for r in traces.to_pylist())
    return trace_rows, node_rows, edge_rows


def build(rows):
    return reconstruct(table(rows), "b", 1)


FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check_acyclic_and_every_span_is_a_node(rows, built):
    t, nodes, edges = built
    b = Built(t.to_pylist(), {(n["trace_id"], n["span_id"]): n for n in nodes.to_pylist()}, edges.to_pylist())
    assert set(b.nodes) == {(r["trace_id"], r["span_id"]) for r in rows}
    assert nodes.num_rows == len(b.nodes)
    g = nx.DiGraph()
    g.add_nodes_from(b.nodes)
    g.add_edges_from(((e["trace_id"], e["upstream_span_id"]), (e["trace_id"], e["downstream_span_id"])) for e in b.edges)
    assert nx.is_directed_acyclic_graph(g)
    assert sum(r["span_count"] for r in b.traces) == len(b.nodes)
    for e in b.edges:
        assert b.nodes[(e["trace_id"], e["upstream_span_id"])]["topo_index"] < \
            b.nodes[(e["trace_id"], e["downstream_span_id"])]["topo_index"]
    for r in b.traces:
        assert r["method"] in {"explicit", "inferred", "flat"}
        assert (r["method"] == "flat") == (r["fallback_reason"] is not None)


def shuffled(rows, rnd):
    out = rows[:]
    rnd.shuffle(out)
    return out


def batched_with_duplicates(rows, rnd, k):
    """The rows spread over ``k`` batches, some sent again in a later batch (at-least-once delivery), shuffled."""
    out = []
    for r in rows:
        batch = rnd.randrange(k)
        out.append({**r, "received_unix_nano": 10 + batch, "batch_id": f"b{batch}"})
        if rnd.random() < 0.2:  # at-least-once delivery: the same span again in a later batch
            out.append({**r, "received_unix_nano": 20 + batch, "batch_id": f"d{batch}"})
    rnd.shuffle(out)
    return out


@FAST
@given(traces(), st.randoms(use_true_random=False), st.integers(1, 4))
def test_acyclic_every_span_a_node_and_independent_of_row_order_batching_and_duplicates(rows, rnd, k):
    """One reconstruction of each drawn input is checked for the invariants, then is what the same rows
    shuffled, and spread over batches with duplicates, must reconstruct to (three reconstructions per
    example, where three separate tests made five)."""
    built = build(rows)
    check_acyclic_and_every_span_is_a_node(rows, built)
    want = canonical(built)
    assert canonical(build(shuffled(rows, rnd))) == want, "row order"
    assert canonical(build(batched_with_duplicates(rows, rnd, k))) == want, "batching and duplicates"


def test_single_trace_invariants_on_a_fixed_example():
    rows = [span("r", None, 0, 20), span("a", "r", 0, 5), span("b", "r", 5, 9), span("c", "ghost", 3, 4)]
    t, nodes, edges = build(rows)
    check_invariants(Built(t.to_pylist(), {n["span_id"]: n for n in nodes.to_pylist()}, edges.to_pylist()))
    assert table(rows).schema == SPANS_V1
