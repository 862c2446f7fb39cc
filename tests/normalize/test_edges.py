"""Edge cases of normalization: empty input, unknown dialects, caps, conversation inheritance, SQL views."""

import pyarrow as pa
import pytest

from tests.realspans import capture, genai_plain_spans, langgraph_spans, openai_spans, to_table
from tracedag.pipeline.normalize.spans import normalize
from tracedag.pipeline.normalize.text import TEXT_CAP
from tracedag.schemas.spans import BASE_SCHEMA, SPANS_V1


def _spans(fn):
    with capture("edge-service") as (provider, exporter):
        fn(provider.get_tracer("edge"))
        return list(exporter.get_finished_spans())


def test_empty_batch_keeps_schema():
    out = normalize(BASE_SCHEMA.empty_table())
    assert out.schema.equals(SPANS_V1, check_metadata=True)
    assert out.num_rows == 0


def test_unknown_dialect_degrades_to_other_with_cleaned_name():
    def emit(tracer):
        for name in ("GET /users/123", "batch 550e8400-e29b-41d4-a716-446655440000", "42", "worker-7 poll"):
            with tracer.start_as_current_span(name, attributes={"weird.attr": "[{]"}):
                pass
        with tracer.start_as_current_span("x", attributes={"gen_ai.operation.name": "teleport"}):
            pass

    rows = to_table(_spans(emit)).to_pylist()
    got = [(r["name"], r["step_type"], r["step_name"]) for r in rows]
    assert got == [
        ("GET /users/123", "other", "GET /users"),
        ("batch 550e8400-e29b-41d4-a716-446655440000", "other", "batch"),
        ("42", "other", "42"),
        ("worker-7 poll", "other", "worker-7 poll"),
        ("x", "other", "x"),
    ]


def test_long_texts_are_capped_and_flagged():
    big = "é" * (TEXT_CAP + 100)

    def emit(tracer):
        attrs = {"openinference.span.kind": "CHAIN", "input.value": big, "output.value": "short"}
        with tracer.start_as_current_span("long", attributes=attrs):
            pass
        with tracer.start_as_current_span("short", attributes={"input.value": "hi"}):
            pass

    rows = to_table(_spans(emit)).to_pylist()
    assert len(rows[0]["input_text"]) == TEXT_CAP and rows[0]["text_truncated"] is True
    assert rows[0]["output_text"] == "short"
    assert rows[1]["text_truncated"] is False


def test_conversation_inherited_per_trace_only():
    def emit(tracer):
        with (
            tracer.start_as_current_span("a", attributes={"session.id": "s-1"}),
            tracer.start_as_current_span("a.child"),
        ):
            pass
        with tracer.start_as_current_span("b"), tracer.start_as_current_span("b.child"):
            pass

    rows = {r["name"]: r["conversation_id"] for r in to_table(_spans(emit)).to_pylist()}
    assert rows == {"a": "s-1", "a.child": "s-1", "b": None, "b.child": None}


def test_resource_run_labels_and_span_label_precedence():
    def emit(tracer):
        with tracer.start_as_current_span("override", attributes={"tracedag.variant_id": "candidate"}):
            pass

    with capture("svc", version="9.9", **{"tracedag.run_id": "r1", "tracedag.replay_index": "3"}) as (p, exp):
        emit(p.get_tracer("t"))
        spans = list(exp.get_finished_spans())
    row = to_table(spans).to_pylist()[0]
    assert (row["run_id"], row["replay_index"], row["variant_id"], row["service_version"]) == (
        "r1",
        3,
        "candidate",
        "9.9",
    )


def test_evaluator_span_without_annotations_links_its_target():
    from opentelemetry.trace import Link

    from tracedag.pipeline.normalize.evaluations import extract_evaluations

    def emit(tracer):
        with tracer.start_as_current_span("answer", attributes={"openinference.span.kind": "LLM"}) as s:
            ctx = s.get_span_context()
        attrs = {"openinference.span.kind": "EVALUATOR", "output.value": "0.25"}
        with tracer.start_as_current_span("relevance judge", attributes=attrs, links=[Link(ctx)]):
            pass

    table = to_table(_spans(emit))
    ev = extract_evaluations(table).to_pylist()
    answer = table.filter(pa.compute.equal(table["name"], "answer"))["span_id"][0].as_py()
    assert [(e["span_id"], e["name"], e["score_value"], e["source_kind"]) for e in ev] == [
        (answer, "relevance judge", 0.25, "openinference.evaluator_span")
    ]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from tracedag.pipeline.store.parquet import write_parquet_atomic
    from tracedag.schemas.layout import table_dir

    data = tmp_path_factory.mktemp("data")
    for i, spans in enumerate(
        [
            langgraph_spans().spans,
            langgraph_spans(dialect="openllmetry").spans,
            openai_spans(True),
            genai_plain_spans(),
        ]
    ):
        write_parquet_atomic(to_table(spans, batch_id=f"b{i}"), table_dir(data, "spans"))
    return data


def test_step_sql_gives_sensible_rows_for_every_dialect(store):
    from tracedag.pipeline.store.views import connect

    con = connect(store)
    rows = con.execute(
        "select service_name, step_type, step_name, count(*) n, avg(duration_ns)/1e6 ms from spans group by all"
    ).fetchall()
    got = {(svc, t, name): n for svc, t, name, n, ms in rows}
    assert all(ms is not None and ms >= 0 for *_, ms in rows)
    # LangGraph traced by OpenInference and by OpenLLMetry give the same node counts
    for node, n in {
        "agent": 4,
        "validator": 4,
        "write_section": 6,
        "tools": 2,
        "classify": 2,
        "fixer": 2,
    }.items():
        assert got[("weather-agent", "chain", node)] == n, node
    assert got[("weather-agent", "tool", "lookup_weather")] == 2
    assert got[("openai-agent", "llm", "chat gpt-4o-mini")] == 3
    assert got[("openai-agent", "tool", "lookup_weather")] == 1
    assert got[("plain-genai", "other", "Job run")] == 1
    assert {t for _, t, _ in got} <= {"llm", "tool", "agent", "chain", "evaluator", "other"}
    tokens = con.execute(
        "select sum(input_tokens), sum(output_tokens) from spans where step_type = 'llm' and service_name = 'weather-agent'"
    ).fetchone()
    assert tokens == (2 * (31 + 58), 2 * (12 + 9))
