"""Run trajectories read from a real store: node detection, ordering, failures, runs, grouping."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from click.testing import CliRunner

from tests.realspans import langgraph_spans, to_table
from tracedag.pipeline.analysis.trajectories import is_subsequence, load_runs
from tracedag.pipeline.cli import cli
from tracedag.pipeline.store.parquet import write_parquet_atomic
from tracedag.pipeline.store.views import connect
from tracedag.schemas.errors import QueryFailed
from tracedag.schemas.layout import table_dir
from tracedag.schemas.tables import STEP_SCORES_V1


def _store_of(tmp_path, table):
    data = tmp_path / "data"
    write_parquet_atomic(table, table_dir(data, "spans"))
    return data


@pytest.mark.parametrize("dialect", ["openinference", "openllmetry"])
def test_real_langgraph_node_path_matches_langgraphs_own_steps(tmp_path, dialect):
    cap = langgraph_spans(dialect=dialect)
    data = _store_of(tmp_path, to_table(cap.spans))
    runs = load_runs(connect(data))
    assert len(runs) == 1
    r = runs[0]
    # LangGraph's own debug stream is the ground truth: the router functions (route_*) and the
    # model calls inside a node are not nodes; the Send fan-out gives three write_section visits.
    assert r.nodes == [s["node"] for s in cap.steps]
    assert r.actions == ["lookup_weather"]
    assert r.run_key == "run-7" and r.scenario == "weather-report" and r.turns == 1
    assert r.final_response


def test_openllmetry_tool_arguments_are_unwrapped(tmp_path):
    cap = langgraph_spans(dialect="openllmetry")
    runs = load_runs(connect(_store_of(tmp_path, to_table(cap.spans))))
    assert runs[0].action_inputs == ['lookup_weather({"city":"Paris"})']


def test_graph_import_from_openllmetry_spans(tmp_path):
    cap = langgraph_spans(dialect="openllmetry")
    data = _store_of(tmp_path, to_table(cap.spans))
    out = tmp_path / "g.json"
    res = CliRunner().invoke(cli, ["graph", "import", "spans", "--data", str(data), "--output", str(out)])
    assert res.exit_code == 0, res.output
    g = json.loads(out.read_text())
    names = [n["name"] for n in g["nodes"]]
    assert {"classify", "agent", "tools", "write_section", "validator", "fixer"} <= set(names)
    assert g["start"] == "classify"
    edges = {(e["source"], e["target"]) for e in g["edges"]}
    assert ("tools", "agent") in edges
    # every transition LangGraph actually took (except the Send fan-out repeats) is in the graph
    steps = [s["node"] for s in cap.steps]
    taken = {(a, b) for a, b in zip(steps, steps[1:], strict=False) if a != b}
    assert taken <= edges, taken - edges


def test_multi_turn_order_run_keys_and_labels(store):
    store.run("r1", "book", [[("router", []), ("ask", [])], [("ask", []), ("book", [("create", '{"d": 1}')])]],
              replay=0, responses=["when?", "booked"])
    # no run id: the conversation id makes the run
    store.turn({"conversation_id": "c9", "scenario_id": "book"}, [("router", [])])
    store.turn({"conversation_id": "c9", "scenario_id": "book"}, [("info", [])])
    # neither: the trace is the run
    lone = store.turn({}, [("router", [])])
    runs = {r.run_key: r for r in load_runs(connect(store.write()))}
    assert runs["r1"].nodes == ["router", "ask", "ask", "book"]
    assert runs["r1"].node_turn == [0, 0, 1, 1]
    assert runs["r1"].turns == 2
    assert runs["r1"].final_response == "booked"
    assert runs["r1"].action_inputs == ['create({"d":1})']
    assert runs["c9"].nodes == ["router", "info"]
    assert runs[lone].scenario == "(unlabelled)"


def test_failures_in_the_subtree_and_from_step_scores(store):
    store.run("r1", "s", [[("a", [("t", "{}")], True), ("b", [("u", "{}")]), ("c", [])]])
    data = store.write()
    # a step score <= 2 on the tool under node b marks b failed too
    u_span = next(r for r in store.rows if r.get("tool_name") == "u")
    scores = pa.Table.from_pylist([{"trace_id": u_span["trace_id"], "span_id": u_span["span_id"],
                                    "metric": "m", "score": 2.0, "source": "rule"}], schema=STEP_SCORES_V1)
    write_parquet_atomic(scores, table_dir(data, "step_scores"))
    r = load_runs(connect(data))[0]
    assert r.nodes == ["a", "b", "c"]
    assert r.node_failed == [True, True, False]


def test_langgraph_children_and_start_are_not_nodes(store):
    labels = {"run_id": "r"}
    trace = "f" * 32
    root = store.span(trace, None, "LangGraph", "chain", **labels)
    store.span(trace, root, "__start__", "chain", langgraph_node="__start__", langgraph_step=0, **labels)
    n1 = store.span(trace, root, "agent", "chain", langgraph_node="agent", langgraph_step=1, **labels)
    store.span(trace, n1, "ChatModel", "llm", langgraph_node="agent", langgraph_step=1, **labels)
    store.span(trace, n1, "should_continue", "chain", langgraph_node="agent", langgraph_step=1, **labels)
    n2 = store.span(trace, root, "agent", "chain", langgraph_node="agent", langgraph_step=2, **labels)
    # a subgraph node inside a node is a node of its own
    store.span(trace, n2, "inner", "chain", langgraph_node="inner", langgraph_step=1, **labels)
    r = load_runs(connect(store.write()))[0]
    assert r.nodes == ["agent", "agent", "inner"]


def test_group_by_expression(store):
    for i, intent in enumerate(["faq", "faq", "book"]):
        trace = f"{i + 1:032x}"
        root = store.span(trace, None, "root", "agent", run_id=f"p{i}", attributes={"app.intent": intent})
        store.span(trace, root, "n", "chain", attributes={"gen_ai.node.name": "router"}, run_id=f"p{i}")
    con = connect(store.write())
    runs = load_runs(con, group_by="attributes['app.intent']")
    assert sorted(r.scenario for r in runs) == ["book", "faq", "faq"]
    with pytest.raises(QueryFailed, match="bad --group-by"):
        load_runs(con, group_by="no_such_column + 1")


def test_intended_path_is_read_from_the_root(store):
    store.run("r1", "s", [[("a", []), ("b", [])]], intended=["a", "b"])
    r = load_runs(connect(store.write()))[0]
    assert r.intended_path == ["a", "b"]


def test_is_subsequence():
    assert is_subsequence(["a", "c"], ["a", "b", "c"])
    assert is_subsequence([], ["a"])
    assert not is_subsequence(["c", "a"], ["a", "b", "c"])
    assert not is_subsequence(["a", "a"], ["a"])


def test_parallel_branches_are_ordered_by_name_and_are_not_transitions(store):
    from tracedag.pipeline.analysis.determinism import analyze

    labels = {"run_id": "par"}
    trace = "e" * 32
    root = store.span(trace, None, "root", "agent", start=0, end=1000, **labels)

    def node(name, start, end):
        store.span(trace, root, name, "chain", start=start, end=end, attributes={"gen_ai.node.name": name},
                   **labels)

    node("plan", 10, 100)
    node("zeta", 110, 300)  # zeta starts first, but it runs beside alpha and beta
    node("beta", 120, 250)
    node("alpha", 130, 200)
    node("join", 310, 400)
    node("plan", 410, 500)
    data = store.write()
    r = load_runs(connect(data))[0]
    assert r.nodes == ["plan", "alpha", "beta", "zeta", "join", "plan"]
    assert r.node_parallel == [False, False, True, True, False, False]
    edges = {(e["source"], e["target"]): e["transitions"]
             for e in analyze(data).tables["edge_utility"].to_pylist()}
    assert edges == {("plan", "alpha"): 1, ("zeta", "join"): 1, ("join", "plan"): 1}


@pytest.mark.parametrize("dialect", ["openinference", "openllmetry"])
def test_real_langgraph_fan_out_is_not_a_self_transition(tmp_path, dialect):
    from tracedag.pipeline.analysis.determinism import analyze

    cap = langgraph_spans(dialect=dialect)
    data = _store_of(tmp_path, to_table(cap.spans))
    edges = {(e["source"], e["target"]) for e in analyze(data).tables["edge_utility"].to_pylist()}
    assert ("write_section", "write_section") not in edges
    assert ("agent", "write_section") in edges and ("write_section", "validator") in edges


def test_same_langgraph_superstep_is_parallel_even_without_overlap(store):
    labels = {"run_id": "lg"}
    trace = "d" * 32
    root = store.span(trace, None, "LangGraph", "chain", start=0, end=1000, **labels)
    for name, step, start in (("plan", 1, 10), ("write", 2, 20), ("write", 2, 30), ("check", 3, 40)):
        store.span(trace, root, name, "chain", start=start, end=start + 5, langgraph_node=name,
                   langgraph_step=step, **labels)
    r = load_runs(connect(store.write()))[0]
    assert r.nodes == ["plan", "write", "write", "check"]
    assert r.node_parallel == [False, False, True, False]


def test_turns_count_user_turns_not_traces(tmp_path):
    """EDGE: the openai client traced by opentelemetry-instrumentation-openai-v2 without an agent
    span makes every model call a trace of its own; a run's turns are its user turns."""
    import openai
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from tests.queries.rca_scenarios import genai_content_env
    from tests.realspans import WEATHER_TOOL, chat_completion, fake_openai_server
    from tracedag import instrument as td

    call = {"id": "call_1", "name": "lookup_weather", "args": {"city": "Paris"}}
    replies = [(200, chat_completion(None, [call])), (200, chat_completion("21C in Paris.")),
               (200, chat_completion("Sunny tomorrow."))]
    exporter = InMemorySpanExporter()
    with genai_content_env(), fake_openai_server(replies) as srv:
        provider = td.configure(service_name="bare-openai", exporter=exporter, set_global=False)
        instrumentor = OpenAIInstrumentor()
        instrumentor.instrument(tracer_provider=provider)
        try:
            client = openai.OpenAI(base_url=srv.base_url, api_key="k", max_retries=0)
            history = [{"role": "user", "content": "Weather in Paris?"}]
            with td.conversation("conv-bare"):
                first = client.chat.completions.create(model="m", messages=history, tools=[WEATHER_TOOL])
                history += [first.choices[0].message.model_dump(exclude_none=True),
                            {"role": "tool", "tool_call_id": "call_1", "content": "21C"}]
                client.chat.completions.create(model="m", messages=history, tools=[WEATHER_TOOL])
                history += [{"role": "assistant", "content": "21C in Paris."},
                            {"role": "user", "content": "And tomorrow?"}]
                client.chat.completions.create(model="m", messages=history)
            td.force_flush()
        finally:
            instrumentor.uninstrument()
            td.shutdown()
    data = _store_of(tmp_path, to_table(exporter.get_finished_spans()))
    (run,) = load_runs(connect(data))
    assert len(run.trace_ids) == 3
    assert run.user_inputs == ["Weather in Paris?", "Weather in Paris?", "And tomorrow?"]
    assert run.turns == 2
