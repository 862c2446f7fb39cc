"""score_store's rule pass (scan + columnar) writes exactly the rows of the per-step reference
(reference.reference_rows: rules.score_step on every step), on generated production-like traces,
on hand-built edge cases and on spans from real instrumentations."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

from bench.gen import make_store
from tests.score.score_support import span
from tests.score.test_rules import SPANS, TRICKY, WEATHER, T
from tracedag.pipeline.dag import build_store
from tracedag.pipeline.normalize.evaluations import extract_evaluations
from tracedag.pipeline.score import inputs, runner, score_store
from tracedag.pipeline.score.columnar import quiet_mask
from tracedag.pipeline.score.reference import reference_rows
from tracedag.pipeline.score.rows import to_table
from tracedag.pipeline.score.rules.toolschema import (
    arguments_are_json,
    arguments_are_json_all,
    parse_arguments,
)
from tracedag.pipeline.score.runner import ScoreStats, _chunks
from tracedag.pipeline.score.scan import read_scan
from tracedag.pipeline.store.parquet import write_parquet_atomic
from tracedag.pipeline.store.views import connect
from tracedag.schemas.layout import table_dir

E = "c" * 32  # a trace without tool definitions: its calm tool steps take the column-wise path


def _rows(data: Path, source: str) -> list[tuple]:
    con = connect(data, shared_macros=False)  # a view, no query macro
    try:
        table = con.sql("select * exclude (scored_unix_nano) from step_scores_all where source = $s",
                        params={"s": source}).to_arrow_table()
    finally:
        con.close()
    return sorted(tuple(r.values()) for r in table.to_pylist())


def _failures(rows: list[tuple]) -> Counter:
    # columns: trace_id span_id build_id metric score label source rule_name judge_model rubric_version
    # explanation taxonomy_l1 taxonomy_l2 taxonomy_l3
    return Counter(r[11:14] for r in rows if r[4] <= 2 and r[11] is not None)


def assert_same_as_reference(data: Path, max_iterations: int | None = None) -> ScoreStats:
    """Score ``data`` with score_store and check its rule rows and counters against the reference."""
    con = connect(data)
    try:
        ref = reference_rows(con, max_iterations)
    finally:
        con.close()
    expected = sorted(tuple(r.values()) for r in to_table(ref).drop_columns(["scored_unix_nano"]).to_pylist())
    stats = score_store(data, max_iterations=max_iterations)
    assert _rows(data, "rule") == expected
    ref_stats = ScoreStats()
    ref_stats.count(ref)
    assert stats.rows_by_source["rule"] == ref_stats.rows_by_source["rule"] == len(ref)
    assert stats.steps_by_source["rule"] == ref_stats.steps_by_source["rule"]
    assert stats.failures_by_category == ref_stats.failures_by_category + _failures(_rows(data, "evaluation"))
    return stats


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    data = tmp_path_factory.mktemp("gen") / "data"
    make_store(data, 6_000, seed=7)
    build_store(data, idle_seconds=0, full=True)
    return data


@pytest.mark.parametrize("max_iterations", [None, 3])
def test_generated_traces(generated, tmp_path, max_iterations):
    import shutil

    data = tmp_path / "data"
    shutil.copytree(generated, data)
    stats = assert_same_as_reference(data, max_iterations)
    assert stats.steps > 5_000 and stats.failures_by_category  # tool timeouts, agents that gave up


def test_chunks_of_builds_hold_at_most_the_steps_asked():
    pending = pa.table({"trace_id": list("abcde"), "build_id": list("vwxyz"), "steps": [5, 5, 5, 20, 1]})
    chunks = [c.column("trace_id").to_pylist() for c in _chunks(pending, 10)]
    assert chunks == [["a", "b"], ["c"], ["d"], ["e"]]  # a build larger than a chunk is a chunk


def test_generated_traces_in_many_chunks(generated, tmp_path, monkeypatch):
    import shutil

    data = tmp_path / "data"
    shutil.copytree(generated, data)
    monkeypatch.setattr(runner, "STEPS_PER_CHUNK", 700)
    stats = assert_same_as_reference(data)
    assert len(stats.files) > 10  # passing rows and the others' rows, per chunk


def _tool(sid: str, args: str | None = None, result: str | None = "12", **kw) -> dict:
    attributes = {"gen_ai.tool.call.arguments": args} if args is not None else {}
    return span(E, sid, "root", step_type="tool", step_name="get_weather", tool_name="get_weather",
                attributes=attributes, output_text=result, **kw)


EDGE = [
    span(E, "root", None, step_type="agent", step_name="weather_agent"),
    # results the SQL test cannot clear: the rules decide (hint keys, arrays, text, empty spellings)
    _tool("r_hint_ok", '{"city": "Paris"}', '{"error": null, "status": "ok", "rows": 3}'),
    _tool("r_hint_err", '{"city": "Paris"}', '{"status": "failed"}'),
    _tool("r_is_error", '{"city": "Paris"}', ' {"isError": true}'),
    _tool("r_list", '{"city": "Paris"}', '["a", "b"]'),
    _tool("r_text_err", '{"city": "Paris"}', "KeyError: 'city'"),
    _tool("r_braces", '{"city": "Paris"}', "{}"),
    _tool("r_braces_ws", '{"city": "Paris"}', "{}  \n"),
    _tool("r_brace_space", '{"city": "Paris"}', "{ }"),
    _tool("r_null", '{"city": "Paris"}', " NULL "),
    _tool("r_empty", '{"city": "Paris"}', ""),
    _tool("r_none", '{"city": "Paris"}', None),
    _tool("r_object", '{"city": "Paris"}', '{"temp_c": 12, "note": "an error rate of 2%"}'),
    # arguments: parse or not (json.loads decides), blank, or only an input_text
    _tool("a_trailing_comma", '{"city": "Paris",}'),
    _tool("a_nan", '{"city": NaN}'),
    _tool("a_surrogate", '{"city": "\\ud800"}'),
    _tool("a_blank", "  \n"),
    _tool("a_nbsp", "\xa0"),
    _tool("a_not_json", "city=Paris"),
    _tool("a_not_json_plain_result", '{"city": ', '{"temp_c": 12}'),  # the scan leaves the result out
    _tool("a_input_only", None, input_text='{"city": 42}'),
    _tool("a_deep_ok", "[" * 150 + "]" * 150),
    # the same failure many times: one rule-table run, the rows re-keyed
    *[_tool(f"t_timeout_{i}", json.dumps({"city": f"c{i}"}), None, status_code=2, error_type="TimeoutError",
            status_message="get_weather timed out") for i in range(5)],
    *[span(E, f"l_len_{i}", "root", step_type="llm", step_name="chat", finish_reason="length",
           output_text=f"partial answer {i}") for i in range(3)],
    # a tool without a schema in a trace that has definitions for another tool
    span(T, "other_tool", "root", step_type="tool", step_name="lookup", output_text='{"ok": true}',
         attributes={"gen_ai.tool.call.arguments": '{"q": 1}'}),
    # an empty tool_name: the step name names the tool (and its schema)
    span(T, "blank_tool_name", "root", step_type="tool", step_name="get_weather", tool_name="",
         output_text='{"temp_c": 1}', attributes={"gen_ai.tool.call.arguments": '{"city": 1}'}),
    # a tool with a schema and its arguments only in input_text (read after the scan), or blank ones
    span(T, "in_only_bad", "root", step_type="tool", step_name="get_weather", input_text='{"city": 42}'),
    span(T, "in_only_good", "root", step_type="tool", tool_name="get_weather", input_text='{"city": "Rome"}',
         attributes={"gen_ai.tool.call.arguments": " "}),
]


def _quiet_spans(data: Path, max_iterations: int | None) -> set[str]:
    con = connect(data)
    try:
        scan = read_scan(con, inputs.pending_rule_builds(con), max_iterations)
    finally:
        con.close()
    return set(scan.facts.column("span_id").filter(pa.array(quiet_mask(scan))).to_pylist())


def test_hand_built_edge_cases(builder):
    spans = SPANS + TRICKY + EDGE
    builder.spans(spans)
    builder.build(spans)
    quiet = _quiet_spans(builder.data, 3)
    assert_same_as_reference(builder.data, max_iterations=3)
    # calm tool steps without a schema take the column-wise path when nothing can fire on them ...
    assert {"r_hint_ok", "r_list", "r_brace_space", "r_none", "r_object", "a_nan", "a_surrogate", "a_blank",
            "a_nbsp", "a_input_only", "a_deep_ok", "other_tool"} <= quiet
    # ... and never when a rule fires, or when the tool has a schema in the trace
    assert not quiet & {"r_hint_err", "r_is_error", "r_text_err", "r_braces", "r_braces_ws", "r_null", "r_empty",
                        "a_trailing_comma", "a_not_json", "a_not_json_plain_result", "t_timeout_0", "tool_ok",
                        "tool_empty"}
    con = connect(builder.data)
    args = dict(con.execute("select span_id, rule_name from step_scores where metric = 'arguments' "
                            "and span_id like 'in_only%'").fetchall())
    con.close()
    assert args == {"in_only_bad": "tool_args_schema", "in_only_good": "no_rule_fired"}
    assert "blank_tool_name" not in quiet


def test_definitions_on_a_span_outside_the_dag(builder):
    # a late span carrying the tool definitions arrived after the build: both passes see it
    t2 = "b" * 32
    spans = [span(t2, "root", None, step_type="agent", step_name="a"),
             span(t2, "bad", "root", step_type="tool", step_name="get_weather", output_text="12",
                  attributes={"gen_ai.tool.call.arguments": '{"city": 42}'}),
             span(t2, "good", "root", step_type="tool", step_name="get_weather", output_text="12",
                  attributes={"gen_ai.tool.call.arguments": '{"city": "Oslo"}'})]
    late = span(t2, "late", "root", step_type="llm", step_name="chat", output_text="hi",
                attributes={"gen_ai.tool.definitions": json.dumps([WEATHER])})
    builder.spans([*spans, late])
    builder.build(spans)
    assert_same_as_reference(builder.data)
    con = connect(builder.data)
    got = dict(con.execute("select span_id, rule_name from step_scores where metric = 'arguments'").fetchall())
    con.close()
    assert got == {"bad": "tool_args_schema", "good": "no_rule_fired"}


def _real_store(data: Path, spans) -> Path:
    from tests.realspans import to_table as spans_table

    table = spans_table(spans)
    write_parquet_atomic(table, table_dir(data, "spans"))
    write_parquet_atomic(extract_evaluations(table), table_dir(data, "evaluations"))
    build_store(data, idle_seconds=0)
    return data


def test_real_instrumentation_spans(tmp_path):
    from tests.realspans import genai_plain_spans, langgraph_spans, openai_spans
    from tests.score.test_realspans import _looping_graph_spans

    captures = {"langgraph": langgraph_spans().spans, "openai": openai_spans(latest=True),
                "openai_old": openai_spans(latest=False, conversation_id="conv-openai-old"),
                "plain": genai_plain_spans(), "looping": _looping_graph_spans()}
    # one store of every capture (one build, one reference, one scoring: ~2.3 s CPU instead of 5 x ~2.5 s);
    # each capture is its own traces (the SDK's random trace ids) and conversation
    traces = {name: {s.context.trace_id for s in spans} for name, spans in captures.items()}
    assert sum(map(len, traces.values())) == len(set().union(*traces.values()))
    spans = [s for capture in captures.values() for s in capture]
    stats = assert_same_as_reference(_real_store(tmp_path / "data", spans), max_iterations=2)
    assert stats.rows_by_source["rule"] > 0


@pytest.mark.parametrize("text", [None, "", " \t", "\xa0\u3000", '{"a": 1}', '{"a": 1,}', "[1, 2,]", '{"a": NaN}',
                                  '{"a": Infinity}', '{"a": nan}', '{"a": "\\ud800"}', "1 2", "\ufeff{}",
                                  '{"a": 1e400}', '{"a": 123456789012345678901234567890}', "[" * 300 + "]" * 300,
                                  '{"a": "x\ty"}', "'a'", '"text"', "true", "{city: Paris"])
def test_arguments_are_json_is_parse_arguments(text):
    assert arguments_are_json(text) == arguments_are_json_all([text])[0] == (parse_arguments(text, None)[1] is None)
