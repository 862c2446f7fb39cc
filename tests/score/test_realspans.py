"""Rules on traces captured from real instrumentations (tests/realspans.py), through the real
normalization, DAG build and scoring: healthy steps get no failure, the real failure is found."""

from __future__ import annotations

import pytest

from tracedag.pipeline.dag import build_store
from tracedag.pipeline.normalize.evaluations import extract_evaluations
from tracedag.pipeline.score import score_store
from tracedag.pipeline.store.parquet import write_parquet_atomic
from tracedag.pipeline.store.views import connect
from tracedag.schemas.layout import table_dir


def _score(data, spans):
    from tests.realspans import to_table

    table = to_table(spans)
    write_parquet_atomic(table, table_dir(data, "spans"))
    write_parquet_atomic(extract_evaluations(table), table_dir(data, "evaluations"))
    build_store(data, idle_seconds=0)
    stats = score_store(data)
    con = connect(data)
    rows = con.execute("select cast(s.name as varchar), cast(s.step_type as varchar), st.metric, st.score, "
                       "st.rule_name, st.taxonomy_l3 from step_scores st join spans s using (trace_id, span_id) "
                       "where st.score < 5 order by 1").fetchall()
    nodes = con.execute("select count(*) from dag_nodes").fetchall()[0][0]
    con.close()
    return stats, rows, nodes


def test_langgraph_openinference_run_has_no_false_failures(tmp_path):
    from tests.realspans import langgraph_spans

    stats, rows, nodes = _score(tmp_path / "data", langgraph_spans().spans)
    assert rows == []  # a healthy graph run (router, tools, loops, fan-out): no rule fires
    assert stats.steps == nodes and stats.steps_by_source["rule"] == nodes


@pytest.mark.parametrize("latest", [True, False])
def test_openai_instrumentation_failure_is_an_http_error(tmp_path, latest):
    from tests.realspans import openai_spans

    stats, rows, _ = _score(tmp_path / "data", openai_spans(latest=latest))
    # the scripted 500 "upstream overloaded" completion; the tool-calling turn stays healthy
    assert [(r[1], r[2], r[3], r[4], r[5]) for r in rows] == [("llm", "execution", 1.0, "http_error", "http_error")]
    assert stats.failures_by_category == {("execution", "call_failure", "http_error"): 1}


def _looping_graph_spans():
    """A real LangGraph graph whose two nodes call each other until the recursion limit stops it."""
    from typing import TypedDict

    from langgraph.errors import GraphRecursionError
    from langgraph.graph import END, START, StateGraph
    from openinference.instrumentation.langchain import LangChainInstrumentor

    from tests.realspans import capture

    class State(TypedDict):
        n: int

    g = StateGraph(State)
    g.add_node("draft", lambda s: {"n": s["n"] + 1})
    g.add_node("review", lambda s: {"n": s["n"]})
    g.add_edge(START, "draft")
    g.add_edge("draft", "review")
    g.add_conditional_edges("review", lambda s: "draft" if s["n"] < 1000 else END)
    graph = g.compile()
    with capture("looping-agent") as (provider, exporter):
        instrumentor = LangChainInstrumentor()
        instrumentor.instrument(tracer_provider=provider)
        try:
            with pytest.raises(GraphRecursionError):
                graph.invoke({"n": 0}, {"recursion_limit": 6})
        finally:
            instrumentor.uninstrument()
        return list(exporter.get_finished_spans())


def test_real_langgraph_recursion_limit_is_a_loop_bound(tmp_path):
    stats, rows, _ = _score(tmp_path / "data", _looping_graph_spans())
    bound = [r for r in rows if r[2] == "termination"]
    # the graph span recorded GraphRecursionError: loop_bound on it, loop_limit_reached
    assert [(r[0], r[3], r[4], r[5]) for r in bound] == [("LangGraph", 1.0, "loop_bound", "loop_limit_reached")]
    assert stats.failures_by_category[("planning", "non_termination", "loop_limit_reached")] == 1
