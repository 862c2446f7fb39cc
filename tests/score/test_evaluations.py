"""Evaluations mapped onto 1-5: hand-built evaluations rows, and spans from real instrumentations
(plain OTel SDK GenAI events, OpenInference annotations/evaluations, an EVALUATOR span) taken
through the real normalization, evaluation extraction and DAG build."""

from __future__ import annotations

import pytest

from tests.score.score_support import span
from tracedag.pipeline.score import score_store
from tracedag.pipeline.score.evaluations import MapStats, detect_scale, map_evaluations, map_one
from tracedag.pipeline.store.views import connect

T = "d" * 32


@pytest.mark.parametrize(
    ("name", "value", "label", "scale", "expected"),
    [
        ("relevance", 0.0, None, "unit", 1.0),
        ("relevance", 0.5, None, "unit", 3.0),
        ("relevance", 1.0, None, "unit", 5.0),
        ("quality", 4.0, None, "likert5", 4.0),
        ("quality", 7.0, None, "ten", 3.8),
        ("quality", 25.0, None, "percent", 2.0),
        ("quality", None, "PASS", None, 5.0),
        ("quality", 0.2, "pass", "unit", 5.0),  # a verdict label wins over the number
        ("quality", None, "Failed", None, 1.0),
        ("quality", None, "partially correct", None, 3.0),
        ("hallucination", 0.9, None, "unit", pytest.approx(1.4)),  # lower is better: 6 - (1 + 3.6)
        ("hallucination", None, "hallucinated", None, 1.0),  # labels are not inverted
        ("quality", None, "blue", None, None),
        ("quality", 3.0, None, None, None),
    ],
)
def test_map_one(name, value, label, scale, expected):
    assert map_one(name, value, label, scale) == expected


def test_detect_scale():
    assert detect_scale([0, 1, 1]) == "unit"
    assert detect_scale([1, 3, 5]) == "likert5"
    assert detect_scale([0, 7, 10]) == "ten"
    assert detect_scale([40, 95]) == "percent"
    assert detect_scale([-1, 2]) is None and detect_scale([]) is None


def _ev(span_id, name, value=None, label=None, t=1, **kw):
    return {"trace_id": T, "span_id": span_id, "name": name, "score_value": value, "label": label,
            "time_unix_nano": t, "source_kind": "gen_ai.evaluation.result", **kw}


def test_map_evaluations_rows():
    rows = [
        _ev("s1", "faithfulness", 0.2, explanation="adds a price", evaluator="ragas"),
        _ev("s1", "faithfulness", 0.9, t=0),  # older result of the same (step, metric): ignored
        _ev("s2", "faithfulness", 1.0),
        _ev("s2", "relevance", None, "irrelevant"),
        _ev("s2", "vibes", 1.0),  # the metric's only value is 1.0: unit scale -> 5
        _ev("s3", "quality", 2.0),  # quality values 2.0 and 0.5: neither [0,1] nor [1,5] -> 0-10 scale
        _ev("s1", "quality", 0.5),
        _ev("s3", "weird", None, "blue"),  # no score, unknown label
        _ev(None, "faithfulness", 0.1),  # no target span
        _ev("s9", "faithfulness", 0.1),  # span not built
        {"trace_id": T, "span_id": "s1", "name": None, "score_value": 1.0},
    ]
    builds = {(T, "s1"): "b1", (T, "s2"): "b1", (T, "s3"): "b1"}
    stats = MapStats()
    out = {(r.span_id, r.metric): r for r in map_evaluations(rows, builds, stats)}
    assert (stats.seen, stats.mapped, stats.unmatched_step, stats.unmappable) == (11, 6, 2, 2)
    f = out[("s1", "faithfulness")]
    assert f.score == pytest.approx(1.8) and f.category.l3 == "unfaithful_output" and f.build_id == "b1"
    assert f.explanation == "ragas via gen_ai.evaluation.result: value 0.2; adds a price"
    assert out[("s2", "faithfulness")].score == 5.0 and out[("s2", "faithfulness")].category is None
    rel = out[("s2", "relevance")]
    assert rel.score == 1.0 and rel.category.l3 == "unclassified" and rel.label == "irrelevant"
    assert rel.explanation.startswith("unclassified: evaluation metric 'relevance' names no failure category")
    assert out[("s2", "vibes")].score == 5.0
    assert out[("s3", "quality")].score == pytest.approx(1.8)  # 1 + 4 * 2 / 10
    assert out[("s1", "quality")].score == pytest.approx(1.2)  # 1 + 4 * 0.5 / 10
    assert out[("s1", "quality")].category.l3 == "unclassified"


def test_evaluations_from_hand_built_store(builder):
    spans = [span(T, "s1", None, step_type="llm", step_name="chat", output_text="x"),
             span(T, "s2", "s1", step_type="tool", step_name="t", output_text="y")]
    builder.spans(spans)
    builder.evaluations([_ev("s1", "format_json", None, "fail"), _ev("s2", "correctness", 0.75)])
    builder.build(spans)
    stats = score_store(builder.data)
    con = connect(builder.data)
    got = {r[0]: r[1:] for r in con.execute(
        "select metric, score, label, taxonomy_l2, taxonomy_l3, build_id from step_scores "
        "where source = 'evaluation'").fetchall()}
    con.close()
    assert got["format_json"] == (1.0, "fail", "output_form", "format_violation", "b1")
    assert got["correctness"] == (4.0, "pass", None, None, "b1")
    assert stats.steps_by_source["evaluation"] == 2 and stats.rows_by_source["evaluation"] == 2
    # an evaluation that arrives later, without a rebuild, is mapped by the next run, once
    builder.evaluations([_ev("s2", "faithfulness", 0.0), _ev("s7", "faithfulness", 0.0)])
    later = score_store(builder.data)
    assert (later.builds, later.rows_by_source["evaluation"], later.evaluations.unmatched_step) == (0, 1, 1)
    assert score_store(builder.data).rows_by_source["evaluation"] == 0


def test_evaluations_from_real_instrumentation(tmp_path):
    from tests.realspans import genai_plain_spans, to_table
    from tracedag.pipeline.dag import build_store
    from tracedag.pipeline.normalize.evaluations import extract_evaluations
    from tracedag.pipeline.store.parquet import write_parquet_atomic
    from tracedag.schemas.layout import table_dir

    data = tmp_path / "data"
    spans = to_table(genai_plain_spans())
    write_parquet_atomic(spans, table_dir(data, "spans"))
    write_parquet_atomic(extract_evaluations(spans), table_dir(data, "evaluations"))
    build_store(data, idle_seconds=0)
    stats = score_store(data)
    con = connect(data)
    rows = con.execute("select cast(s.name as varchar), st.metric, st.score, st.rule_name, st.taxonomy_l3 "
                       "from step_scores st join spans s using (trace_id, span_id) "
                       "where st.source = 'evaluation' or st.score <= 2 order by 1, 2").fetchall()
    con.close()
    assert rows == [
        # gen_ai.evaluation.result event on the chat span: label pass (value 0.9)
        ("chat gpt-4o", "tool_choice", 5.0, None, None),
        # the tool span recorded TimeoutError and status ERROR: the timeout rule
        ("execute_tool get_time", "execution", 1.0, "timeout", "timeout"),
        # OpenInference annotation (score 4, label good) and evaluation (toxicity 0.0, inverted)
        ("greeting", "helpfulness", 5.0, None, None),
        ("greeting", "toxicity", 5.0, None, None),
        # an evaluation event matched by gen_ai.response.id (5.0 on 1-5) and the EVALUATOR span (label correct)
        ("openai.chat", "brevity", 5.0, None, None),
        ("openai.chat", "correctness", 5.0, None, None),
    ]
    assert (stats.evaluations.seen, stats.evaluations.mapped) == (5, 5)
