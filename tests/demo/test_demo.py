"""``tracedag demo`` end to end: its output is checked against the tables it left in the store."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from tests.demo.demo_support import DemoRun, private_demo
from tracedag.pipeline.cli import cli
from tracedag.pipeline.demo import run as demo_mod
from tracedag.pipeline.demo.config import DemoConfig
from tracedag.pipeline.store.querying import run_named, run_sql


@pytest.fixture(scope="module")
def demo_run(demo_newcomer: DemoRun, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, DemoRun]:
    """The demo's store and what it printed: ``tracedag demo`` (seed 7, exit 0) run once per test run by
    tests/demo/demo_support.py, copied here (the validate and regress lines' commands run on it)."""
    run = private_demo(demo_newcomer, tmp_path_factory.mktemp("demo") / "newcomer")
    return run.data, run


def _sql(data: Path, sql: str) -> list[dict]:
    return run_sql(data, sql).to_pylist()


def _number(pattern: str, text: str) -> int:
    match = re.search(pattern, text)
    assert match, f"{pattern!r} not in output"
    return int(match.group(1))


def test_demo_runs_every_stage(demo_run):
    data, result = demo_run
    for label in ("start the collector", "simulate conversations", "build execution DAGs", "score steps",
                  "root causes, propagation, step stats", "determinism, utility, picture"):
        assert label in result.output
    assert "unavailable" not in result.output and "skipped" not in result.output
    assert len(result.output.splitlines()) <= 100  # two screens


def test_printed_counts_match_the_store(demo_run):
    data, result = demo_run
    out = result.output
    store = _sql(data, """select (select count(*) from spans) as spans, (select count(*) from traces) as traces,
                                 (select count(distinct run_id) from spans) as conversations""")[0]
    assert _number(r"store: (\d+) spans", out) == store["spans"] > 0
    assert _number(r"(\d+) traces,", out) == store["traces"]
    assert _number(r"(\d+) conversations,", out) == store["conversations"]
    simulated = _number(r"simulated (\d+) conversations", out)
    assert simulated == store["traces"]  # one trace per conversation, none lost on the OTLP path
    failed_traces = run_named(data, "root_causes").to_pylist()
    assert _number(r"root causes of the (\d+) failed traces", out) == len(failed_traces) > 0
    assert _number(r"\((\d+) failed,", out) == len(failed_traces)  # the agent and the store agree


def test_root_cause_table_matches_the_query(demo_run):
    data, result = demo_run
    rows = run_named(data, "root_causes").to_pylist()
    per_step: dict[str, int] = {}
    for r in rows:
        per_step[r["root_step_name"]] = per_step.get(r["root_step_name"], 0) + 1
    printed = {m.group(1): int(m.group(2)) for m in re.finditer(
        r"^\s*(\S+)\s+(?:tool|chain|agent|llm)\s+.*?\s(\d+)\s+\d+\.\d\s*$", result.output, re.MULTILINE)}
    top = sorted(per_step.items(), key=lambda kv: -kv[1])[:5]
    for step, n in top:
        assert printed.get(step) == n
    assert max(per_step, key=lambda k: per_step[k]) == "calendar_search"


def test_faulty_tool_is_the_root_cause_of_the_failures_it_caused(demo_run):
    data, _ = demo_run
    # failed traces whose first failing step is an injected calendar fault that no later calendar
    # call made good (a retry that succeeds recovers the failure: it is then no cause, by design)
    caused = {r["trace_id"] for r in _sql(data, """
        with first_error as (
            select trace_id, tool_name as tool, error_type, start_time_unix_nano as at
            from spans where status_code = 2 and step_type in ('tool', 'llm')
            qualify row_number() over (partition by trace_id order by start_time_unix_nano) = 1)
        select f.trace_id from first_error f
        join spans root on root.trace_id = f.trace_id and root.parent_span_id is null and root.status_code = 2
        where f.tool = 'calendar_search'
          and (f.error_type like '%CalendarTimeout' or f.error_type like '%CalendarUnavailable')
          and not exists (select 1 from spans earlier where earlier.trace_id = f.trace_id
                          and earlier.status_code = 2 and earlier.end_time_unix_nano < f.at)
          and not exists (select 1 from spans later where later.trace_id = f.trace_id
                          and later.tool_name = 'calendar_search' and later.status_code <> 2
                          and later.start_time_unix_nano > f.at)""")}
    assert len(caused) >= 5
    roots = {r["trace_id"]: r["root_step_name"] for r in run_named(data, "root_causes").to_pylist()}
    assert caused <= set(roots)
    assert {roots[t] for t in caused} == {"calendar_search"}


def test_constrained_variant_is_more_deterministic(demo_run):
    data, result = demo_run
    files = sorted((data / "tables" / "determinism_agent").glob("*.parquet"))
    assert files
    rows = pq.read_table(files[-1]).to_pylist()
    by = {(r["agent"].rsplit(".", 1)[-1], r["comparison"]): r for r in rows}
    for comparison in ("replays", "variants"):
        constrained, permissive = by[("constrained", comparison)], by[("permissive", comparison)]
        assert constrained["node_consistency"] > permissive["node_consistency"]
        assert constrained["action_consistency"] > permissive["action_consistency"]
        line = re.search(rf"^\s*constrained\s+{comparison}\s+(\d+)\s+([\d.]+)", result.output, re.MULTILINE)
        assert line and int(line.group(1)) == constrained["runs"]
        assert float(line.group(2)) == pytest.approx(constrained["node_consistency"], abs=0.005)


def test_pictures_graphs_and_next_commands(demo_run):
    data, result = demo_run
    pictures = sorted((data / "pictures").glob("*.svg"))
    assert len(pictures) == 2 and all("<svg" in p.read_text() for p in pictures)
    assert (data / "graphs" / "court_booking.constrained.json").exists()
    trace = re.search(r"tracedag show ([0-9a-f]{32}) --data", result.output).group(1)
    assert _sql(data, f"select count(*) as n from traces where trace_id = '{trace}'")[0]["n"] == 1
    assert "tracedag query root_causes --data" in result.output and "tracedag sql --data" in result.output
    shown = CliRunner().invoke(cli, ["show", trace, "--data", str(data)])
    assert shown.exit_code == 0 and "calendar_search" in shown.output


def test_validation_line_matches_the_validations_table(demo_run, monkeypatch):
    data, result = demo_run
    monkeypatch.chdir(data.parent)  # the line names paths as the user sees them, relative to the demo's directory
    rows = run_named(data, "validations").to_pylist()
    judged = [r for r in rows if r["passed"] is not None]
    assert judged and {r["agent"] for r in rows} == {"court_booking.constrained"}
    passed = sum(1 for r in judged if r["passed"])
    line = re.search(r"structural validation: (\d+) of (\d+) constrained runs.*--model (\S+)", result.output)
    assert line and (int(line.group(1)), int(line.group(2))) == (passed, len(judged))
    checked = CliRunner().invoke(cli, ["validate", "check", "--data", str(data), "--model", line.group(3)])
    assert checked.exit_code == 0 and f"{passed} of {len(judged)} runs passed" in checked.output


def test_failed_stage_is_reported_not_faked(tmp_path, monkeypatch):
    from tracedag.pipeline.demo import stages

    def broken_build(data):
        raise RuntimeError("no DAG today")

    monkeypatch.setattr(stages, "build", broken_build)

    class Silent:
        def add_task(self, description, total=None):
            return description

        def update(self, task_id, **kw):
            pass

    config = DemoConfig(data=tmp_path / "d", replays=1, variants=0, latency_scale=0.0)
    result = demo_mod.run_demo(config, Silent())
    assert result.ok("simulate") and result.ok("flush")
    assert result.stages["build"] == "failed: RuntimeError: no DAG today"
    assert result.stages["score"].startswith("skipped") and result.stages["determinism"].startswith("skipped")
    assert "root_causes" not in result.tables


def test_data_dir_safety(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("precious")
    with pytest.raises(demo_mod.DataDirNotEmpty):
        demo_mod.prepare_data_dir(mine, keep=False)
    assert (mine / "notes.txt").exists()
    demo_mod.prepare_data_dir(mine, keep=True)
    assert (mine / "notes.txt").exists()
    old = tmp_path / "old"
    demo_mod.prepare_data_dir(old, keep=False)
    (old / "tables").mkdir()
    demo_mod.prepare_data_dir(old, keep=False)
    assert not (old / "tables").exists()


def test_regress_line_matches_the_gate(demo_run, monkeypatch):
    import json
    import shlex

    data, result = demo_run
    monkeypatch.chdir(data.parent)  # the printed command names --data tracedag-demo, relative to where it ran
    line = re.search(r"regression gate, permissive vs constrained agent: (PASS|FAIL)\b.*?(\d+) of (\d+) metrics "
                     r"compared on both sides regressed.*; try: (tracedag regress .*)$", result.output, re.MULTILINE)
    assert line, result.output
    assert "as expected" in line.group(0)  # the two agents differ by design: the line says what that predicts
    again = CliRunner().invoke(cli, [*shlex.split(line.group(4))[1:], "--format", "json"])
    assert again.exit_code == (1 if line.group(1) == "FAIL" else 0), again.output
    doc = json.loads(again.output)
    assert sum(m["status"] == "fail" for m in doc["metrics"]) == int(line.group(2))
    assert sum(m["pairs"] > 0 for m in doc["metrics"]) == int(line.group(3)) and doc["paired_cases"] == 15
    assert not [m["metric"] for m in doc["metrics"] if "court_booking." in m["metric"]]  # every agent metric pairs
    # the demo's scripted agents' durations are this machine's load: its config leaves the latencies out
    assert "--config" in line.group(4) and not [m["metric"] for m in doc["metrics"] if "latency" in m["metric"]]


def test_attribution_line_matches_the_queries(demo_run):
    data, result = demo_run
    convs = run_named(data, "root_causes", {"per": "conversation"}).to_pylist()
    fails = run_named(data, "failures").to_pylist()
    line = next(x for x in result.output.splitlines() if x.startswith("attribution:"))
    assert _number(r"attribution: (\d+) failed conversations", line) == len(convs)
    assert _number(r"(\d+) failures recovered", line) == sum(1 for r in fails if r["recovered"])
    assert _number(r"(\d+) by a retry", line) == sum(1 for r in fails if r["recovery"] == "retry")
    assert _number(r"(\d+) cancelled steps", line) == sum(1 for r in fails if r["cancelled"])
    assert "-p per=conversation" in line


def test_step_roles_line_matches_the_store(demo_run):
    data, result = demo_run
    line = next(x for x in result.output.splitlines() if x.startswith("step roles (AgentEval):"))
    roles = {r["step_role"]: r["n"] for r in _sql(data, "select step_role, count(*) as n from dag_nodes "
                                                          "where step_role is not null group by 1")}
    assert roles and set(roles) <= {"PLAN", "TOOLSEL", "PARAMGEN", "EXEC", "SYNTH"}
    for role, n in roles.items():
        assert f"{role} {n} (mean" in line
    edges = _sql(data, "select count(*) as n from dag_edges where edge_kind = 'tool_call'")[0]["n"]
    assert _number(r"(\d+) tool-call edges", line) == edges
    assert "step_role" in line and "tracedag sql --data" in line


def test_value_provenance_line_matches_the_store(demo_run):
    data, result = demo_run
    line = next(x for x in result.output.splitlines() if x.startswith("value provenance:"))
    edges = _sql(data, "select count(*) as n from dag_edges where edge_kind = 'data'")[0]["n"]
    assert edges > 0 and _number(r"(\d+) data edges", line) == edges
    silent = sum(1 for r in run_named(data, "root_causes", {"per": "conversation"}).to_pylist() if r["silent_producer"])
    assert _number(r"(\d+) root causes are silent producers", line) == silent
    assert "edge_kind = 'data'" in line and "tracedag sql --data" in line


def test_object_storage_line_matches_the_local_store(demo_run):
    """The demo publishes its spans from two writers to an in-memory object store, builds and reads them back."""
    data, result = demo_run
    line = next(x for x in result.output.splitlines() if x.startswith("object storage:"))
    traces = _sql(data, "select count(*) as n from traces")[0]["n"]
    assert _number(r"(\d+) writers published", line) == 3  # two collectors and the builder
    assert _number(r"a fresh reader got (\d+) traces", line) == traces > 0
    assert _number(r"(\d+) root causes, the same as the local store", line) == len(run_named(data, "root_causes"))
    assert "tracedag collect --data s3://" in line
