"""AgentEval step roles (``dag_nodes.step_role``) derived from spans of REAL instrumentation, and
given by a workflow spec node's ``role``."""

from __future__ import annotations

import json

from tests.rca_agents import load_case, paramgen_cases


def _roles(data, order="start_time_unix_nano"):
    from tracedag.pipeline.store.views import connect

    con = connect(data)
    try:
        return con.execute(f"select cast(step_type as varchar), step_name, step_role from dag_nodes order by {order}")\
            .fetchall()
    finally:
        con.close()


def test_an_agent_loop_plans_selects_parameters_executes_and_synthesizes(tmp_path):
    (case,) = [c for c in paramgen_cases(("openai-v2",)) if c.name == "guardrail-between"]
    load_case([case], tmp_path / "data")
    got = [(t, r) for t, _, r in _roles(tmp_path / "data")]
    # agent; call with a tool call; the guardrail's check (a model call before more work); the tool;
    # the final answer
    assert got == [("agent", None), ("llm", "PARAMGEN"), ("llm", "PLAN"), ("tool", "EXEC"), ("llm", "SYNTH")]


def test_graph_nodes_get_roles_by_name_and_a_spec_can_set_them(tmp_path):
    from tests.realspans import langgraph_spans, to_table
    from tracedag.pipeline.dag import build_store
    from tracedag.pipeline.store.parquet import write_parquet_atomic
    from tracedag.schemas.layout import table_dir

    data = tmp_path / "data"
    write_parquet_atomic(to_table(langgraph_spans().spans), table_dir(data, "spans"))
    build_store(data, idle_seconds=0)
    roles = {(t, n): r for t, n, r in _roles(data)}
    assert roles[("chain", "classify")] == "TOOLSEL"
    assert roles[("chain", "tools")] == "EXEC" and roles[("tool", "lookup_weather")] == "EXEC"
    assert roles[("chain", "write_section")] == "SYNTH"
    assert roles[("chain", "validator")] is None
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"nodes": [{"name": "validator", "role": "PLAN"}, {"name": "classify"}],
                                "edges": [], "start": "classify", "terminals": ["validator"]}))
    build_store(data, idle_seconds=0, full=True, spec=spec)
    roles = {(t, n): r for t, n, r in _roles(data)}
    assert roles[("chain", "validator")] == "PLAN" and roles[("chain", "classify")] == "TOOLSEL"


def test_a_spec_role_must_be_an_agenteval_role():
    import pytest

    from tracedag.schemas.agent_graph import GraphInvalid, parse_graph

    with pytest.raises(GraphInvalid, match="role must be one of PLAN, TOOLSEL, PARAMGEN, EXEC, SYNTH"):
        parse_graph({"nodes": [{"name": "a", "role": "THINK"}], "edges": [], "start": "a", "terminals": ["a"]})
    graph = parse_graph({"nodes": [{"name": "a", "role": "SYNTH"}], "edges": [], "start": "a", "terminals": ["a"]})
    assert graph.to_dict()["nodes"] == [{"name": "a", "role": "SYNTH"}]
