"""Rules on hand-built spans and dag_nodes, through score_store and the step_scores view."""

from __future__ import annotations

import json

import pytest

from tests.score.score_support import span
from tracedag.pipeline.score import score_store
from tracedag.pipeline.score.rules.table import RULES, StepFacts, score_step
from tracedag.pipeline.score.taxonomy import load_taxonomy
from tracedag.pipeline.store.views import connect

T = "a" * 32
WEATHER = {"type": "function", "name": "get_weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"], "additionalProperties": False}}


def _exc(kind: str, message: str) -> dict:
    return {"time_unix_nano": 1500, "name": "exception",
            "attributes": {"exception.type": kind, "exception.message": message}}


def tool(sid: str, **kw) -> dict:
    return span(T, sid, "root", step_type="tool", step_name="get_weather", tool_name="get_weather", **kw)


def llm(sid: str, **kw) -> dict:
    return span(T, sid, "root", step_type="llm", step_name="chat", model="gpt-4o", **kw)


SPANS = [
    span(T, "root", None, step_type="agent", step_name="weather_agent", output_text="done"),
    llm("llm_ok", finish_reason="stop", output_text="hello", output_tokens=3,
        attributes={"gen_ai.tool.definitions": json.dumps([WEATHER])}),
    llm("llm_length", finish_reason='["length"]', output_text="The forecast is", output_tokens=256),
    llm("llm_filter", finish_reason="content_filter", output_text="", output_tokens=0),
    llm("llm_empty", finish_reason="stop", output_text="  ", output_tokens=0),
    llm("llm_toolcall", finish_reason="tool_calls", output_text="", output_tokens=12),
    llm("llm_conn", status_code=2, error_type="openai.APIConnectionError", status_message="Connection error."),
    tool("tool_timeout", status_code=2, error_type="httpx.ReadTimeout", status_message="timed out"),
    tool("tool_429", status_code=2, error_type="RateLimitError", attributes={"http.response.status_code": "429"}),
    tool("tool_500", status_code=2, error_type="500", status_message="Internal Server Error"),
    tool("tool_notfound", output_text="Error: get_wether is not a valid tool, try one of [get_weather]."),
    tool("tool_result_error", output_text='{"error": "city not found"}'),
    tool("tool_empty", output_text="", attributes={"gen_ai.tool.call.arguments": '{"city": "Paris"}'}),
    tool("tool_bad_type", attributes={"gen_ai.tool.call.arguments": '{"city": 42}'}, output_text="12"),
    tool("tool_unknown_field", attributes={"gen_ai.tool.call.arguments": '{"city": "Paris", "units": "K"}'},
         output_text="12"),
    tool("tool_not_json", attributes={"gen_ai.tool.call.arguments": "{city: Paris"}, output_text="12"),
    tool("tool_ok", attributes={"gen_ai.tool.call.arguments": '{"city": "Paris"}'}, output_text='{"temp_c": 12}'),
    span(T, "graph", "root", step_type="chain", step_name="LangGraph", status_code=2,
         events=[_exc("GraphRecursionError", "Recursion limit of 25 reached without hitting a stop condition.")]),
    span(T, "node_exc", "root", step_type="chain", step_name="route", events=[_exc("KeyError", "'messages'")]),
    span(T, "ret", "root", step_type="retriever", step_name="search", output_text="[doc 1]"),
]

# (span, metric) -> (score, rule_name, taxonomy_l3), worked out by hand from the rule table
EXPECTED = {
    ("root", "execution"): (5, "no_rule_fired", None),
    ("root", "termination"): (5, "no_rule_fired", None),
    ("llm_ok", "execution"): (5, "no_rule_fired", None),
    ("llm_ok", "output"): (5, "no_rule_fired", None),
    ("llm_length", "output"): (2, "finish_length", "output_truncated"),
    ("llm_filter", "output"): (1, "finish_content_filter", "content_filtered"),
    ("llm_empty", "output"): (2, "empty_llm_output", "empty_output"),
    ("llm_toolcall", "output"): (5, "no_rule_fired", None),
    ("llm_conn", "execution"): (1, "connection_error", "connection_error"),
    ("tool_timeout", "execution"): (1, "timeout", "timeout"),
    ("tool_429", "execution"): (1, "rate_limited", "rate_limited"),
    ("tool_500", "execution"): (1, "http_error", "http_error"),
    ("tool_notfound", "execution"): (1, "tool_not_found", "tool_not_found"),
    ("tool_result_error", "execution"): (1, "tool_status_error", "tool_error"),
    ("tool_empty", "output"): (3, "empty_tool_output", None),
    ("tool_empty", "arguments"): (5, "no_rule_fired", None),
    ("tool_bad_type", "arguments"): (2, "tool_args_schema", "malformed_arguments"),
    ("tool_unknown_field", "arguments"): (2, "tool_args_unknown_field", "hallucinated_arguments"),
    ("tool_not_json", "arguments"): (1, "tool_args_not_json", "malformed_arguments"),
    ("tool_ok", "execution"): (5, "no_rule_fired", None),
    ("tool_ok", "arguments"): (5, "no_rule_fired", None),
    ("graph", "termination"): (1, "loop_bound", "loop_limit_reached"),
    ("graph", "execution"): (1, "status_error", "unhandled_exception"),
    ("node_exc", "execution"): (1, "exception_event", "unhandled_exception"),
    ("ret", "execution"): (5, "no_rule_fired", None),
}


def _scores(data):
    con = connect(data, shared_macros=False)  # views only, no query macro
    rows = con.execute("select span_id, metric, score, rule_name, taxonomy_l1, taxonomy_l2, taxonomy_l3, "
                       "source, build_id, label from step_scores").fetchall()
    con.close()
    return {(r[0], r[1]): r[2:] for r in rows}


def test_rules_on_hand_built_trace(builder):
    builder.spans(SPANS)
    builder.build(SPANS)
    stats = score_store(builder.data)
    got = _scores(builder.data)
    for key, (score, rule, l3) in EXPECTED.items():
        assert key in got, key
        assert (got[key][0], got[key][1], got[key][4]) == (score, rule, l3), key
    assert stats.steps == len(SPANS)
    # every step has a row; every row is a rule row of build b1
    assert {k[0] for k in got} == {s["span_id"] for s in SPANS}
    assert {(v[5], v[6]) for v in got.values()} == {("rule", "b1")}
    # failing rows always carry all three taxonomy levels, passing rows none
    tax = load_taxonomy()
    for v in got.values():
        if v[0] <= 2:
            assert tax.classify(v[4]) is not None and (v[2], v[3]) == (tax.leaves[v[4]].l1, tax.leaves[v[4]].l2)
            assert v[7] == "fail"
        else:
            assert v[2:5] == (None, None, None)
    # tools without a schema in the trace have no arguments row; the retriever has only execution
    assert ("ret", "output") not in got
    assert stats.failures_by_category[("execution", "call_failure", "timeout")] == 1


def test_incremental_and_rebuild(builder):
    builder.spans(SPANS[:3])
    builder.build(SPANS[:3], build_id="b1", built=10)
    first = score_store(builder.data, progress=True)
    assert first.builds == 1 and first.files
    again = score_store(builder.data)
    assert (again.builds, again.steps, again.files) == (0, 0, [])
    # a rebuild of the trace (late span) gets scored; the view keeps only the latest build's scores
    builder.build(SPANS[:4], build_id="b2", built=20)
    third = score_store(builder.data)
    assert third.builds == 1 and third.steps == 4
    got = _scores(builder.data)
    assert {v[6] for v in got.values()} == {"b2"}
    assert ("llm_filter", "output") in got


def test_iteration_bound_only_when_configured(builder):
    spans = [span(T, "root", None, step_type="agent", step_name="a"),
             span(T, "n3", "root", step_type="chain", step_name="validate", iteration=3)]
    builder.spans(spans)
    builder.build(spans)
    score_store(builder.data, max_iterations=3)
    got = _scores(builder.data)
    assert got[("n3", "termination")][:2] == (2, "iteration_bound")
    assert got[("root", "termination")][:2] == (5, "no_rule_fired")


@pytest.mark.parametrize(
    ("facts", "metric", "rule"),
    [
        (StepFacts(T, "s", step_type="tool", status_code=2, error_type="TimeoutError"), "execution", "timeout"),
        (StepFacts(T, "s", step_type="llm", http_status="504", status_code=2), "execution", "timeout"),
        (StepFacts(T, "s", step_type="llm", status_code=2, status_message="429 Too Many Requests"),
         "execution", "rate_limited"),
        (StepFacts(T, "s", step_type="tool", output_text='{"isError": true, "content": []}'),
         "execution", "tool_status_error"),
        (StepFacts(T, "s", step_type="tool", output_text='{"status": "error", "content": "boom"}'),
         "execution", "tool_status_error"),
        (StepFacts(T, "s", step_type="agent", status_code=2, error_type="MaxTurnsExceeded"),
         "termination", "loop_bound"),
        (StepFacts(T, "s", step_type="chain", task_status="failure"), "execution", "status_error"),
        (StepFacts(T, "s", step_type="llm", finish_reason="error"), "output", "finish_error"),
    ],
)
def test_single_rules(facts, metric, rule):
    rows = {r.metric: r for r in score_step(facts)}
    assert rows[metric].rule_name == rule


@pytest.mark.parametrize("text", ["The meeting timeout is 5 minutes.", "Error rates fell 5% in May.",
                                  '{"error": null, "rows": 3}', '{"status": "ok"}'])
def test_no_error_words_without_a_failure(text):
    # error words in a successful tool's result are not a failure signal
    facts = StepFacts(T, "s", step_type="tool", output_text=text)
    assert {r.metric: r.score for r in score_step(facts)} == {"execution": 5, "output": 5}


@pytest.mark.parametrize("text", ["Error: ValueError('negative')\n Please fix your mistakes.",
                                  "KeyError: 'city'", "Traceback (most recent call last):\n  File x"])
def test_tool_results_that_report_errors(text):
    rows = {r.metric: r for r in score_step(StepFacts(T, "s", step_type="tool", output_text=text))}
    assert (rows["execution"].score, rows["execution"].rule_name) == (1, "tool_status_error")


def test_rule_table_is_consistent():
    tax = load_taxonomy()
    names = [r.name for r in RULES]
    assert len(names) == len(set(names))
    for r in RULES:
        assert tax.classify(r.category) is not None, r.name
        assert 1 <= r.score <= 5 and r.metric in ("execution", "output", "arguments", "termination")


def test_openinference_tool_schema_and_json_input(builder):
    t2 = "e" * 32
    schema = {"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {"q": {"type": "string"}, "k": {"type": "integer", "minimum": 1}},
        "required": ["q"]}}}
    spans = [
        span(t2, "llm", None, step_type="llm", step_name="ChatOpenAI", output_text="calling lookup",
             attributes={"llm.tools.0.tool.json_schema": json.dumps(schema)}),
        # OpenInference TOOL spans carry the arguments as input.value (JSON), normalized to input_text
        span(t2, "bad", "llm", step_type="tool", step_name="lookup", input_text='{"q": "x", "k": 0}', output_text="r"),
        span(t2, "good", "llm", step_type="tool", step_name="lookup", input_text='{"q": "x", "k": 3}', output_text="r"),
        span(t2, "text", "llm", step_type="tool", step_name="lookup", input_text="x", output_text="r"),
    ]
    builder.spans(spans)
    builder.build(spans)
    score_store(builder.data)
    got = _scores(builder.data)
    assert got[("bad", "arguments")][:2] == (2, "tool_args_schema")
    assert "k: 0 is less than the minimum of 1" in _explanation(builder.data, "bad", "arguments")
    assert got[("good", "arguments")][:2] == (5, "no_rule_fired")
    assert got[("text", "arguments")][:2] == (5, "no_rule_fired")  # plain-text input: nothing to validate


def _explanation(data, span_id, metric):
    con = connect(data, shared_macros=False)  # views only, no query macro
    try:
        return con.execute("select explanation from step_scores where span_id = $s and metric = $m",
                           {"s": span_id, "m": metric}).fetchall()[0][0]
    finally:
        con.close()


def test_concurrent_scorers_do_not_score_twice(builder):
    import threading

    builder.spans(SPANS)
    builder.build(SPANS)
    results = []
    threads = [threading.Thread(target=lambda: results.append(score_store(builder.data))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.steps for r in results) == [0, 0, len(SPANS)]
    con = connect(builder.data)
    dupes = con.execute("select count(*) from (select span_id, metric from step_scores group by all "
                        "having count(*) > 1)").fetchall()[0][0]
    con.close()
    assert dupes == 0


TRICKY = [
    llm("ws", output_text="\n\n\n\n\n\n\n\n\n", output_tokens=5, finish_reason="stop"),
    llm("nul", output_text="   null   ", output_tokens=2),
    llm("nbsp", output_text="\xa0\u3000 \xa0", output_tokens=1),
    llm("fr_list", finish_reason='["stop", "length"]', output_text="enough text here"),
    llm("fr_stop", finish_reason="STOP", output_text="An error in the report was fixed"),
    llm("zero", output_text="plenty of words", output_tokens=0),
    llm("long", output_text="x" * 500, output_tokens=100),
    span(T, "untyped", "root", output_text="", status_code=1),
    span(T, "http_ok", "root", step_type="chain", step_name="fetch", attributes={"http.response.status_code": "200"}),
    span(T, "task_ok", "root", step_type="chain", step_name="t", attributes={"gen_ai.task.status": "success"}),
    span(T, "task_fail", "root", step_type="chain", step_name="t", attributes={"gen_ai.task.status": "FAILURE"}),
    span(T, "empty_exc", "root", step_type="agent", step_name="a", events=[{"time_unix_nano": 1, "name": "exception"}]),
    span(T, "iter3", "root", step_type="chain", step_name="loop", iteration=3),
    span(T, "err_empty", "root", step_type="agent", step_name="a", error_type=""),
]


def test_sql_fast_path_equals_the_rule_table(builder):
    """Quiet steps get their rows from SQL; every step must score exactly as score_step says."""
    from tracedag.pipeline.score import inputs

    spans = SPANS + TRICKY
    builder.spans(spans)
    builder.build(spans)
    stats = score_store(builder.data, max_iterations=3)
    got = {(k[0], k[1]): (v[0], v[1]) for k, v in _scores(builder.data).items()}
    con = connect(builder.data)
    inputs.use_pending(con, con.sql("select distinct trace_id, build_id from dag_nodes").to_arrow_table())
    facts_sql = "select * from score_facts order by trace_id, topo_index"
    quiet_sql = f"select span_id from score_facts where {inputs.QUIET_SQL}"
    defs = inputs.tool_definitions(con)
    rows = con.sql(facts_sql).to_arrow_table().to_pylist()
    quiet = {r[0] for r in con.sql(quiet_sql, params={"max_iterations": 3}).fetchall()}
    con.close()
    expected = {(r.span_id, r.metric): (r.score, r.rule_name)
                for row in rows for r in score_step(inputs._facts(row, defs, 3))}
    assert got == expected
    # the fast path was taken for the healthy non-tool steps, never for a step where a rule fires
    assert {"root", "llm_ok", "ret", "long", "fr_stop", "task_ok"} <= quiet
    # conservative: any HTTP status, or an LLM output with few letters, takes the Python path
    assert not quiet & {"http_ok", "llm_toolcall"}
    assert not quiet & {"ws", "nul", "nbsp", "fr_list", "zero", "task_fail", "iter3", "llm_length", "graph"}
    assert stats.steps == len(spans)
