"""The pytest plugin, loaded through its pytest11 entry point in a separate pytest run: markers,
fixtures, and eval results exported to a real collector and scored into step_scores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from xml.etree import ElementTree as ET

from tests.testing.test_harness import CASE
from tracedag.pipeline.dag import build_store
from tracedag.pipeline.score import score_store
from tracedag.pipeline.store.querying import run_sql

TESTS = '''
import pytest
from tracedag.testing import run_step

calls = {"flaky": 0, "late": 0, "never": 0}

@pytest.mark.invariant(repeats=3)
def test_invariant_holds():
    pass

@pytest.mark.invariant(repeats=3)
def test_invariant_flaky():
    calls["flaky"] += 1
    assert calls["flaky"] != 2

@pytest.mark.capability(reruns=3)
def test_capability_third_time():
    calls["late"] += 1
    assert calls["late"] >= 3

@pytest.mark.capability(reruns=2)
def test_capability_never():
    calls["never"] += 1
    assert calls["never"] >= 3

@pytest.mark.tracedag_case("cases/*.json")
def test_each_case(tracedag_case):
    assert run_step(lambda c: c.step.name, tracedag_case).output == "calendar"

def test_judged(judge):
    assert judge.grade("a reply").passed

def test_zz_reruns_counted():
    assert calls == {"flaky": 2, "late": 3, "never": 2}
'''


def _pytest(tmp_path, *args, env=None):
    (tmp_path / "cases").mkdir(exist_ok=True)
    for name in ("one", "two"):
        (tmp_path / "cases" / f"{name}.json").write_text(json.dumps(CASE))
    (tmp_path / "test_steps.py").write_text(TESTS)
    report = tmp_path / "report.xml"
    run_env = {k: v for k, v in os.environ.items() if not k.startswith(("TRACEDAG_", "PYTEST_"))}
    run_env.update(env or {})
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
                    "test_steps.py", *args], cwd=tmp_path, env=run_env, capture_output=True, text=True, timeout=120)
    outcomes = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        outcomes[case.get("name")] = kinds[0] if kinds else "passed"
    return outcomes, report.read_text()


def test_markers_and_fixtures(tmp_path):
    outcomes, xml = _pytest(tmp_path, env={"TRACEDAG_JUDGE_SCRIPT": "5"})
    assert outcomes == {
        "test_invariant_holds": "passed", "test_invariant_flaky": "failure",
        "test_capability_third_time": "passed", "test_capability_never": "failure",
        "test_each_case[one]": "passed", "test_each_case[two]": "passed", "test_judged": "passed",
        "test_zz_reruns_counted": "passed",
    }
    assert "invariant: run 2 of 3 failed" in xml and "capability: none of 2 runs passed" in xml


def test_judge_fixture_skips_without_a_judge(tmp_path):
    outcomes, _ = _pytest(tmp_path, "-k", "judged")
    assert outcomes == {"test_judged": "skipped"}


def test_eval_results_land_in_step_scores(tmp_path, collector):
    endpoint = f"http://127.0.0.1:{collector.http_port}"
    outcomes, _ = _pytest(tmp_path, "--tracedag-endpoint", endpoint, env={"TRACEDAG_JUDGE_SCRIPT": "2"})
    assert outcomes["test_judged"] == "failure"  # a score of 2 is below the default threshold 4
    collector.flush()
    data = collector.config.data
    build_store(data, idle_seconds=0)
    score_store(data)
    rows = run_sql(data, """
        select s.name as span, sc.metric, sc.score, sc.source from step_scores sc
        join spans s on s.trace_id = sc.trace_id and s.span_id = sc.span_id
        where sc.source = 'evaluation' order by 1, 2""").to_pylist()
    got = {(r["span"], r["metric"], r["score"]) for r in rows}
    assert ("invoke_node test test_invariant_holds", "invariant", 5) in got
    assert ("invoke_node test test_invariant_flaky", "invariant", 1) in got
    assert ("invoke_node test test_capability_never", "capability", 1) in got
    assert ("invoke_node test test_judged", "judge", 2) in got
    labels = run_sql(data, "select distinct scenario_id from spans where name like 'invoke_node test %'").to_pylist()
    assert {"test_steps.py::test_judged"} <= {r["scenario_id"] for r in labels}
