"""Tool-call edges (edge kind ``tool_call``) on spans of REAL instrumentation: each tool step is linked
to the model call that emitted its call, by call id where the dialect records it, else by time."""

from __future__ import annotations

import numpy as np
import pytest

from tests.rca_agents import DIALECTS, paramgen_cases, trace_ids

NAMES = ("unknown-field", "one-of-two", "guardrail-between", "recovered")


@pytest.fixture(scope="module")
def cases():
    return {(c.dialect, c.name): c for c in paramgen_cases()}


@pytest.fixture(scope="module")
def stored(cases, tmp_path_factory):
    """The cases of every dialect in ONE store, built once; each case reads the edges of its own traces (an edge
    joining one conversation to another would show as a wrong edge in one of them)."""
    from tests.rca_agents import load_case

    data = tmp_path_factory.mktemp("toolcalls") / "data"
    load_case([cases[(dialect, name)] for dialect in DIALECTS for name in NAMES], data)
    return data


def _edges(data, kind, traces=None):
    """The ``kind`` edges (upstream, downstream) of the traces ``traces`` (all when None)."""
    from tracedag.pipeline.store.views import connect

    con = connect(data)
    try:
        rows = con.execute("select trace_id, upstream_span_id, downstream_span_id from dag_edges where edge_kind = $k",
                           {"k": kind}).fetchall()
    finally:
        con.close()
    return [(u, d) for t, u, d in rows if traces is None or t in traces]


def test_the_store_holds_no_tool_call_edge_outside_the_cases_traces(cases, stored):
    mine = set().union(*(trace_ids(cases[(dialect, name)]) for dialect in DIALECTS for name in NAMES))
    assert _edges(stored, "tool_call") == _edges(stored, "tool_call", mine)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_each_tool_step_hangs_off_the_model_call_that_emitted_it(cases, dialect, stored):
    for name in NAMES:
        case = cases[(dialect, name)]
        edges = _edges(stored, "tool_call", trace_ids(case))
        tools = {d for _, d in edges}
        # every tool span got exactly one edge, from a model call
        assert len(edges) == len(tools) >= 1, (name, edges)
        if name == "recovered":  # call 1 -> tool 1, call 2 (the corrected call) -> tool 2
            assert len({u for u, _ in edges}) == 2
        else:  # the guardrail model call in between is not the one that emitted the call
            assert {u for u, _ in edges} == {case.root_span_id}, name


def test_llm_output_call_ids_are_normalized_in_each_dialect_that_records_them(cases):
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from tracedag.pipeline.convert.reference import requests_to_table

    for dialect, want in (("openai-v2", "c1,c2"), ("openinference", "c1,c2"), ("openai-v2-no-content", None)):
        req = ExportTraceServiceRequest.FromString(cases[(dialect, "one-of-two")].requests[0])
        t = requests_to_table([(req, 1, "b1")])
        rows = [r for r in t.select(["step_type", "tool_call_id", "start_time_unix_nano"]).to_pylist()
                if r["step_type"] == "llm"]
        first = min(rows, key=lambda r: r["start_time_unix_nano"])
        assert first["tool_call_id"] == want, dialect


def test_agent_groups_are_the_nearest_agent_ancestor():
    from tracedag.pipeline.dag.toolcalls import agent_groups
    from tracedag.pipeline.dag.tree import levels

    # 0 agent > 1 llm, 2 chain > 3 agent > 4 tool ; trace 1: 5 root tool
    parent = np.array([-1, 0, 0, 2, 3, -1])
    agent = np.array([True, False, False, True, False, False])
    trace = np.array([0, 0, 0, 0, 0, 1])
    got = agent_groups(parent, levels(parent).by_depth, agent, trace)
    assert got.tolist() == [6, 0, 0, 0, 3, 7]
