"""Human labels: import (CSV and Parquet, bad rows with line numbers), the human step scores, and
agreement (kappa, confusion, recall) against values worked out by hand in the comments."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from tests.score.score_support import span
from tracedag.pipeline.cli import cli
from tracedag.pipeline.score import score_store
from tracedag.pipeline.score.labels.agreement import agreement, agreement_report, cohen_kappa, to_class
from tracedag.pipeline.score.labels.human import BadLabelFile, import_labels
from tracedag.pipeline.score.rows import ScoreRow, to_table
from tracedag.pipeline.score.taxonomy import load_taxonomy
from tracedag.pipeline.store import files as store
from tracedag.pipeline.store.parquet import write_parquet_atomic
from tracedag.pipeline.store.views import connect
from tracedag.schemas.layout import table_dir

T = "c" * 32
HUMAN = [1, 2, 5, 5, 3, 1]
JUDGE = [1, 1, 5, 4, 3, 5]

CSV = f"""trace_id,span_id,metric,score,label,taxonomy_l3,annotator
{T},s0,quality,1,,unfaithful_output,ann
{T},s1,quality,2,,timeout,ann
{T},s2,quality,,pass,,ann
{T},,quality,3,,,ann
{T},s3,quality,5,,,ann
{T},s4,quality,2,,,ann
{T},s4,quality,4,,,bob
{T},s9,quality,abc,,,ann
{T},s9,quality,7,,,ann
{T},s9,quality,,maybe,,ann
{T},s9,quality,1,,nope,ann
{T},s5,quality,1,,,ann
"""


@pytest.fixture
def labelled(builder, tmp_path):
    spans = [span(T, f"s{i}", None if i == 0 else "s0", step_type="llm", step_name="chat", output_text="ok")
             for i in range(6)]
    builder.spans(spans)
    builder.build(spans)
    score_store(builder.data)  # rule rows: all 5 (clean spans)
    tax = load_taxonomy()
    cats = {0: tax.leaves["unfaithful_output"], 1: tax.leaves["timeout"]}
    judge_rows = [ScoreRow(T, f"s{i}", "b1", "quality", float(s), "judge", judge_model="m", category=cats.get(i))
                  for i, s in enumerate(JUDGE)]
    write_parquet_atomic(to_table(judge_rows), table_dir(builder.data, "step_scores"))
    path = tmp_path / "labels.csv"
    path.write_text(CSV, encoding="utf-8")
    return builder.data, path


def test_import_reports_bad_rows_with_line_numbers(labelled):
    data, path = labelled
    result = import_labels(data, path)
    # header = line 1; the bad rows are on lines 5, 9, 10, 11, 12
    assert result.bad == [
        (5, "empty span_id"),
        (9, "score 'abc' is not a number"),
        (10, "score 7 outside 1-5"),
        (11, "label 'maybe' is not a known verdict (pass/fail/partial...) and no score given"),
        (12, "taxonomy_l3 'nope' is not in the taxonomy"),
    ]
    assert (result.imported, result.duplicates, result.not_built) == (7, 0, 0)
    again = import_labels(data, path)
    assert (again.imported, again.duplicates) == (0, 7)
    con = connect(data)
    assert con.execute("select count(*) from human_labels").fetchone()[0] == 7
    human = {r[0]: r[1:] for r in con.execute(
        "select span_id, score, build_id, taxonomy_l3, explanation, label from step_scores "
        "where source = 'human'").fetchall()}
    con.close()
    assert human["s2"][0] == 5.0 and human["s2"][4] == "pass"  # label pass -> 5
    assert human["s4"][0] == 3.0  # mean of ann (2) and bob (4)
    assert human["s0"][1:3] == (None, "unfaithful_output")
    assert human["s5"][2] == "unclassified" and human["s5"][3].startswith("unclassified: the human label")


def test_strict_imports_nothing(labelled):
    data, path = labelled
    result = import_labels(data, path, strict=True)
    assert result.imported == 0 and len(result.bad) == 5
    assert not store.parquet_files(data, "human_labels")


def test_parquet_labels_and_missing_columns(builder, tmp_path):
    path = tmp_path / "labels.parquet"
    pq.write_table(pa.table({"trace_id": [T, T], "span_id": ["s1", "s2"], "metric": ["q", "q"],
                             "label": ["fail", "???"]}), path)
    result = import_labels(builder.data, path, annotator="carol")
    assert result.imported == 1 and result.bad == [(2, "label '???' is not a known verdict (pass/fail/partial...) "
                                                        "and no score given")]
    assert result.not_built == 1
    con = connect(builder.data)
    assert con.execute("select annotator, score from human_labels").fetchall() == [("carol", 1.0)]
    con.close()
    bad = tmp_path / "bad.csv"
    bad.write_text("trace_id,span_id,score\nx,y,1\n", encoding="utf-8")
    with pytest.raises(BadLabelFile, match="missing columns metric"):
        import_labels(builder.data, bad)


def test_kappa_and_recall_hand_computed():
    # 5 classes: observed 3/6; human marginals {1:2, 2:1, 3:1, 5:2}, judge {1:2, 3:1, 4:1, 5:2}
    # expected (2*2 + 1*1 + 2*2)/36 = 9/36; kappa = (0.5 - 0.25) / 0.75 = 1/3
    # fail/pass: human F F P P P F, judge F F P P P P; observed 5/6; expected (3*2 + 3*4)/36 = 0.5
    # kappa = (5/6 - 1/2) / (1/2) = 2/3; recall 2/3 (s0, s1 of s0, s1, s5); precision 2/2
    a = agreement("judge", HUMAN, JUDGE)
    assert a.kappa == pytest.approx(1 / 3)
    assert a.kappa_fail == pytest.approx(2 / 3)
    assert (a.human_failures, a.detected, a.source_failures) == (3, 2, 2)
    assert a.recall == pytest.approx(2 / 3) and a.precision == 1.0
    assert a.matrix == [[1, 0, 0, 0, 1], [1, 0, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 0, 0, 0], [0, 0, 0, 1, 1]]
    assert cohen_kappa([1, 1], [1, 1]) is None  # chance agreement 1: undefined
    assert cohen_kappa(["a", "b"], ["a", "b"]) == 1.0
    assert (to_class(2.5), to_class(2.49), to_class(0.2)) == (3, 2, 1)


def test_agreement_report_on_the_store(labelled):
    data, path = labelled
    import_labels(data, path)
    results, labelled_steps = agreement_report(data)
    by = {a.source: a for a in results}
    assert labelled_steps == 6 and set(by) == {"judge", "rule"}
    j = by["judge"]
    # s4's human score is the mean 3 (2 and 4), as in HUMAN
    assert (j.pairs, j.kappa, j.kappa_fail, j.recall) == (6, pytest.approx(1 / 3), pytest.approx(2 / 3),
                                                          pytest.approx(2 / 3))
    # areas on the steps both failed: s0 generation/generation, s1 execution/execution -> kappa 1
    # (observed 1; expected (1*1 + 1*1) / 4 = 0.5)
    assert (j.kappa_category, j.category_pairs) == (1.0, 2)
    # rules saw nothing wrong (all 5): observed 2/6, expected (2*6)/36 -> kappa 0; fail/pass kappa 0; recall 0
    r = by["rule"]
    assert (r.kappa, r.kappa_fail, r.recall, r.precision) == (pytest.approx(0), pytest.approx(0), 0.0, None)
    only_other, n = agreement_report(data, metric="other")
    assert (only_other, n) == ([], 0)


def test_cli_labels_and_score(labelled):
    data, path = labelled
    runner = CliRunner(env={"COLUMNS": "200"})
    out = runner.invoke(cli, ["labels", "import", "--data", str(data), str(path)])
    assert out.exit_code == 1, out.output
    assert "imported 7 labels" in out.output and "taxonomy_l3 'nope'" in out.output
    out = runner.invoke(cli, ["labels", "agreement", "--data", str(data)])
    assert out.exit_code == 0, out.output
    assert "0.333" in out.output and "66.7% (2/3)" in out.output and "confusion" in out.output
    out = runner.invoke(cli, ["score", "--data", str(data), "--no-progress", "--no-judge"])
    assert out.exit_code == 0, out.output
    assert "scored 0 steps of 0 new builds" in out.output
