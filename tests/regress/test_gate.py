"""``tracedag regress`` end to end on a real built and scored store: verdicts, exit codes, outputs."""

from __future__ import annotations

import json
from xml.etree import ElementTree as ET

import pytest
from click.testing import CliRunner

from tests.regress.regress_support import gate_store, half
from tests.shared_dirs import copy_of
from tracedag.pipeline.cli import cli
from tracedag.pipeline.regress import RegressConfig, RegressError, run_regress


@pytest.fixture(scope="module")
def gstore(tmp_path_factory):
    """v1 healthy; v1b the same again; v2 half the tool calls fail; slow/fast a 30 ms / 1 ms tool;
    few: only scenarios s1, s2 and a new s9; other: no common scenario; norep: no replay index;
    notok: v1 without tokens."""
    return gate_store(tmp_path_factory.mktemp("regress") / "data", {
        "v1": {}, "v1b": {}, "v2": {"fails": half}, "slow": {"tool_ms": 30}, "fast": {"tool_ms": 1},
        "few": {"scenarios": ("s1", "s2", "s9")}, "other": {"scenarios": ("x1", "x2")},
        "norep": {"replay_labels": False}, "notok": {"tokens": None},
    })


def _run(data, *args):
    return CliRunner().invoke(cli, ["regress", "--data", str(data), *args], catch_exceptions=False)


def _json(data, base, cand, *extra):
    out = _run(data, "--baseline", base, "--candidate", cand, "--format", "json", *extra)
    return out.exit_code, json.loads(out.output)


def _metric(doc, name):
    return next(m for m in doc["metrics"] if m["metric"] == name)


def test_a_regression_fails_the_gate_with_the_hand_computed_effect(gstore):
    code, doc = _json(gstore, "service_version=v1", "service_version=v2")
    assert code == 1 and doc["exit_code"] == 1
    assert doc["paired_cases"] == 16 and doc["pair_by"] == ["scenario_id", "replay_index"]
    pass_rate = _metric(doc, "pass_rate")
    # replays 0 and 1 of every scenario fail on v2: 8 of 16 case differences are -1, the rest 0
    assert pass_rate["delta"] == pytest.approx(-0.5)
    assert pass_rate["baseline_mean"] == 1.0 and pass_rate["candidate_mean"] == 0.5
    assert pass_rate["ci_high"] < 0 and pass_rate["status"] == "fail"
    assert pass_rate["p_adjusted"] < 0.05 <= _metric(doc, "tokens")["p_adjusted"]
    assert doc["correction"] == "bh"
    assert _metric(doc, "step_score[tool=search]")["status"] == "fail"
    assert _metric(doc, "root_cause[tool=search]")["delta"] == pytest.approx(0.5)
    assert _metric(doc, "tokens")["status"] == "ok"


def test_identical_behaviour_passes(gstore):
    code, doc = _json(gstore, "service_version=v1", "service_version=v1b")
    assert code == 0
    assert {m["status"] for m in doc["metrics"]} == {"ok"}
    assert all(abs(m["delta"]) < 1e-9 for m in doc["metrics"])  # the same runs, up to float rounding


def test_direction_slower_tool_fails_faster_tool_improves(gstore):
    code, slow = _json(gstore, "service_version=v1", "service_version=slow")
    assert code == 1
    assert _metric(slow, "step_latency_p95[tool=search]")["status"] == "fail"
    assert _metric(slow, "step_latency_p95[tool=search]")["delta"] == pytest.approx(25.0, abs=0.01)
    code, fast = _json(gstore, "service_version=v1", "service_version=fast")
    assert code == 0
    assert _metric(fast, "step_latency_p95[tool=search]")["status"] == "improved"


def test_unpaired_cases_are_listed_not_dropped(gstore):
    code, doc = _json(gstore, "service_version=v1", "service_version=few")
    assert doc["paired_cases"] == 8
    assert doc["unpaired"]["candidate"] == [f"scenario_id=s9|replay_index={r}" for r in range(4)]
    assert len(doc["unpaired"]["baseline"]) == 8
    out = _run(gstore, "--baseline", "service_version=v1", "--candidate", "service_version=few")
    assert "unpaired candidate cases (4, not compared): scenario_id=s9|replay_index=0" in out.output


def test_replay_index_on_one_side_only_pairs_by_scenario(gstore):
    code, doc = _json(gstore, "service_version=v1", "service_version=norep")
    assert doc["pair_by"] == ["scenario_id"] and doc["paired_cases"] == 4
    assert any("replay_index is not on both sides" in n for n in doc["notes"])


def test_a_metric_on_one_side_only_is_listed_as_absent(gstore):
    code, doc = _json(gstore, "service_version=v1", "service_version=notok")
    tokens = _metric(doc, "tokens")
    assert tokens["status"] == "absent" and tokens["note"] == "only in the baseline"
    assert code == 0
    code, _ = _json(gstore, "service_version=v1", "service_version=notok", "--strict")
    assert code == 1


@pytest.mark.parametrize(("base", "cand", "message"), [
    ("service_version=v9", "service_version=v1", "selects no built trace (service_version in the store:"),
    ("service_version=v1", "service_version=other", "no common cases when pairing by scenario_id, replay_index"),
    ("service_version=v1", "scenario_id=s1", "share 4 trace(s)"),
    ("v1", "service_version=v2", "expected key=value"),
    ("sql:", "service_version=v2", "sql: needs a condition"),
    ("sql:no_such_column = 1", "service_version=v2", "--baseline"),
])
def test_usage_and_data_errors_exit_2(gstore, base, cand, message):
    out = _run(gstore, "--baseline", base, "--candidate", cand)
    assert out.exit_code == 2
    assert message in out.output


def test_malformed_config_exits_2(gstore, tmp_path):
    bad = tmp_path / "regress.yaml"
    bad.write_text("metrics: {workflow_score: {warn: high}}\n")
    out = _run(gstore, "--baseline", "service_version=v1", "--candidate", "service_version=v2", "--config", str(bad))
    assert out.exit_code == 2 and "warn must be a number" in out.output


def test_unscored_store_is_a_data_error(tmp_path):
    data = gate_store(tmp_path / "data", {"v1": {}, "v2": {}}, score=False)
    with pytest.raises(RegressError, match="metric absent: pass_rate on the baseline.*workflow_score on the candidate"):
        run_regress(data, "service_version=v1", "service_version=v2", RegressConfig(resamples=200))


def test_junit_markdown_and_table(gstore, tmp_path):
    junit, md = tmp_path / "r.xml", tmp_path / "r.md"
    out = _run(gstore, "--baseline", "service_version=v1", "--candidate", "service_version=v2",
               "--junit", str(junit), "--markdown", str(md), "--seed", "3")
    assert out.exit_code == 1
    assert "FAIL" in out.output and "pass_rate" in out.output and "step_score[tool=search]" in out.output
    suite = ET.parse(junit).getroot()
    cases = suite.findall("testcase")
    assert int(suite.get("tests")) == len(cases) > 10
    failed = [c for c in cases if c.find("failure") is not None]
    assert int(suite.get("failures")) == len(failed) > 0
    names = {(c.get("classname"), c.get("name")) for c in failed}
    assert ("tracedag.regress.pass_rate", "pass_rate") in names
    assert ("tracedag.regress.step_score", "tool=search") in names
    text = md.read_text()
    assert text.startswith("### tracedag regress: FAIL")
    assert "| **FAIL** | `pass_rate` | 16 |" in text and "<details>" in text


def test_seed_makes_the_intervals_reproducible(gstore):
    _, a = _json(gstore, "service_version=v1", "service_version=v2", "--seed", "5")
    _, b = _json(gstore, "service_version=v1", "service_version=v2", "--seed", "5")
    _, c = _json(gstore, "service_version=v1", "service_version=v2", "--seed", "6", "--resamples", "500")
    ci = [(m["ci_low"], m["ci_high"]) for m in a["metrics"]]
    assert ci == [(m["ci_low"], m["ci_high"]) for m in b["metrics"]]
    assert c["resamples"] == 500 and c["seed"] == 6


def test_label_globs_and_sql_selectors(gstore):
    code, doc = _json(gstore, "run_id=v1/*", "sql:t.service_version = 'v2'")
    assert code == 1 and doc["baseline"]["traces"] == 16 and doc["candidate"]["traces"] == 16


def test_structural_validation_pass_rate_when_the_store_has_verdicts(gstore, tmp_path):
    import pyarrow as pa

    from tracedag.pipeline.store.parquet import write_parquet_atomic
    from tracedag.pipeline.store.querying import run_sql
    from tracedag.schemas.layout import table_dir
    from tracedag.schemas.tables import VALIDATIONS_V1

    data = copy_of(gstore, tmp_path / "data")  # v1 and v2 (half its tool calls fail) among the others
    traces = run_sql(data, "select trace_id, service_version, replay_index from traces "
                     "where service_version in ('v1', 'v2')").to_pylist()
    rows = [{"run_key": t["trace_id"], "trace_ids": [t["trace_id"]], "checked_unix_nano": 1,
             # v2 fails validation on replays 0 and 1: pass rate 1.0 -> 0.5
             "passed": t["service_version"] == "v1" or t["replay_index"] >= 2} for t in traces]
    write_parquet_atomic(pa.Table.from_pylist(rows, schema=VALIDATIONS_V1), table_dir(data, "validations"))
    result = run_regress(data, "service_version=v1", "service_version=v2", RegressConfig(resamples=500))
    metric = next(m for m in result.metrics if m.metric == "validation_pass_rate")
    assert (metric.baseline_mean, metric.candidate_mean, metric.status) == (1.0, 0.5, "fail"), metric
    assert result.exit_code == 1
