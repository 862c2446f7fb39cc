"""``tracedag validate learn|check`` over a real store: built, scored, passing told from failed runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner

from tests.analysis.analysis_support import Store
from tracedag.pipeline.cli import cli
from tracedag.pipeline.dag import build_store
from tracedag.pipeline.score import score_store
from tracedag.pipeline.store.parquet import write_parquet_atomic
from tracedag.pipeline.store.querying import run_named
from tracedag.pipeline.validate import read_runs
from tracedag.pipeline.validate.runs import BadSelection, NotReady
from tracedag.schemas.layout import table_dir
from tracedag.schemas.tables import VALIDATIONS_V1

BOOK = [("router", []), ("check_availability", [("calendar_search", '{"date": "sat"}')]),
        ("book_court", [("create_booking", '{"slot": 1}')]), ("finalize", [])]
# the fixture's tool spans keep their span name as step name, so their step keys end in it
CAL, BOOKING = "check_availability/execute_tool calendar_search", "book_court/execute_tool create_booking"
SKIP = [("router", []), ("book_court", [("create_booking", '{"slot": 1}')]), ("finalize", [])]
FAIL = [("router", []), ("check_availability", [("calendar_search", None)], True), ("finalize", [])]


def _runs(store, scenario, paths, agent="agentA", prefix=None):
    for i, steps in enumerate(paths):
        store.run(f"{prefix or scenario}-{i}", scenario, [steps], replay=i, agent=agent)


@pytest.fixture(scope="module")
def built_once(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six runs (four of scenario book, one of them failed; two of info), built and scored once per module: only
    ever copied."""
    store = Store(tmp_path_factory.mktemp("built") / "data")
    _runs(store, "book", [BOOK, BOOK, BOOK, FAIL])
    _runs(store, "info", [[("router", []), ("club_info", [("club_info", None)]), ("finalize", [])]] * 2)
    data = store.write()
    build_store(data, idle_seconds=0)
    score_store(data)
    return data


@pytest.fixture
def built(built_once: Path, store: Store) -> Path:
    """A copy of ``built_once`` in the test's ``store`` directory: the runs a test adds (``store.write()``, its rows
    start empty) and what the commands write land in its own store."""
    shutil.copytree(built_once, store.data)
    return store.data


def _cli(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_runs_steps_and_pass_fail_from_the_store(built):
    runs = read_runs(built)
    assert len(runs) == 6
    book = [r for r in runs if r.scenario == "book"]
    assert [r.passed for r in book] == [True, True, True, False]  # the failed calendar is a root cause
    names = [s.step_key.split("/", 1)[1] for s in book[0].steps]
    assert names == ["router", "check_availability", CAL, "book_court", BOOKING, "finalize"]


def test_learn_then_check_writes_the_validations_table(built, store, tmp_path):
    model = tmp_path / "model.json"
    r = _cli("validate", "learn", "--data", built, "--out", model)
    assert r.exit_code == 0, r.output
    saved = json.loads(model.read_text())
    book = saved["scenarios"]["book"]
    assert [s["name"] for s in book["states"] if s["essential"]] == [
        "router", "check_availability", CAL, "book_court", BOOKING, "finalize"]
    assert len(book["runs"]) == 3 and saved["agent"] == "agentA"
    assert "router > check_availability" in r.output

    store.rows = []  # write() writes the rows it holds: only the new run goes into the new file
    _runs(store, "book", [SKIP], prefix="new")  # a booking that never checked the calendar
    data = store.write()
    build_store(data, idle_seconds=0)
    score_store(data)
    r = _cli("validate", "check", "--data", data, "--model", model)
    assert r.exit_code == 0, r.output
    assert "5 of 7 runs passed" in r.output, r.output
    rows = {x["run_key"]: x for x in run_named(data, "validations").to_pylist()}
    skipped = rows["new-0"]
    assert skipped["passed"] is False
    assert skipped["explanation"] == ("State 'check_availability' never reached after 'router' "
                                      f"(also missing: '{CAL}')")
    assert skipped["scenario_pass_rate"] == pytest.approx(3 / 5) and skipped["run_failed"] is False
    # the run whose calendar failed went to finalize without booking
    assert rows["book-3"]["passed"] is False and rows["book-3"]["run_failed"] is True
    assert rows["book-3"]["missing"] == ["book_court", BOOKING]
    r = _cli("validate", "check", "--data", data, "--model", model, "--fail-under", "0.9")
    assert r.exit_code == 1 and "below --fail-under 90%" in r.output


def test_runs_selection_by_labels_and_sql(built, tmp_path):
    assert len(read_runs(built, "scenario_id=book")) == 4
    assert len(read_runs(built, "scenario_id=book,replay_index=0")) == 1
    assert len(read_runs(built, "run_id=book-*")) == 4
    assert len(read_runs(built, "sql: t.scenario_id = 'info' and t.replay_index = 1")) == 1
    assert len(read_runs(built, "agent_name=agentA")) == 6  # a root-span column
    with pytest.raises(BadSelection, match="selects no run"):
        read_runs(built, "scenario_id=nothing")
    with pytest.raises(BadSelection, match="expected key=value"):
        read_runs(built, "scenario_id > 1")
    with pytest.raises(BadSelection, match="Binder Error"):
        read_runs(built, "sql: no_such_column > 1")
    r = _cli("validate", "learn", "--data", built, "--runs", "scenario_id=book", "--out", tmp_path / "m.yaml")
    assert r.exit_code == 0, r.output
    assert "info" not in (tmp_path / "m.yaml").read_text()


def test_bad_input_is_one_line_and_exit_code_2(built, store, tmp_path):
    model = tmp_path / "m.json"
    r = _cli("validate", "learn", "--data", built, "--runs", "scenario_id=info,replay_index=0", "--out", model)
    assert r.exit_code == 2
    assert r.output.strip().splitlines() == [
        "Error: too few passing runs to learn from (need 2 per scenario): scenario info: 1 passing of 1 run(s); "
        "narrow --runs, pick other scenarios, or lower --min-runs"]
    assert _cli("validate", "learn", "--data", built, "--out", model).exit_code == 0
    raw = json.loads(model.read_text())
    raw["scenarios"]["book"]["states"][0]["essential"] = "yes"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(raw))
    r = _cli("validate", "check", "--data", built, "--model", bad)
    assert r.exit_code == 2 and "scenarios.book.states[0].essential: must be true or false" in r.output
    raw["scenarios"]["book"]["states"][0]["essential"] = True
    raw["agent"] = "agentB"
    bad.write_text(json.dumps(raw))
    r = _cli("validate", "check", "--data", built, "--model", bad)
    assert r.exit_code == 2
    assert "learned for agent 'agentB'; the selected runs are of 'agentA'" in r.output


def test_a_store_without_scores_is_refused(store):
    _runs(store, "book", [BOOK, BOOK])
    data = store.write()
    with pytest.raises(NotReady, match="no execution DAGs built: run tracedag build first"):
        read_runs(data)
    build_store(data, idle_seconds=0)
    with pytest.raises(NotReady, match="no step scores: run tracedag score first"):
        read_runs(data)


def _vrow(run_key, scenario, passed, model="m.json", start=0):
    return {"run_key": run_key, "agent": "a", "scenario": scenario, "passed": passed, "model": model,
            "start_time_unix_nano": start, "missing": [], "out_of_order": [], "too_slow": [], "failure_paths": []}


def test_named_query_validations_on_a_hand_made_table(tmp_path):
    # s1: pass, fail, pass -> 2/3; s2: pass plus a run without a skeleton (null) -> 1/1
    rows = [_vrow("a", "s1", True, start=3), _vrow("b", "s1", False, start=2), _vrow("c", "s1", True, start=1),
            _vrow("d", "s2", True), _vrow("e", "s2", None)]
    data = tmp_path / "data"
    write_parquet_atomic(pa.Table.from_pylist(rows, schema=VALIDATIONS_V1), table_dir(data, "validations"))
    out = run_named(data, "validations").to_pylist()
    assert [(r["scenario"], r["run_key"]) for r in out] == [("s1", "b"), ("s1", "c"), ("s1", "a"), ("s2", "e"),
                                                             ("s2", "d")]
    assert [r["scenario_runs"] for r in out] == [3, 3, 3, 1, 1]
    assert out[0]["scenario_pass_rate"] == pytest.approx(2 / 3) and out[3]["scenario_pass_rate"] == 1.0
    failed = run_named(data, "validations", {"failed_only": "true"}).to_pylist()
    assert [r["run_key"] for r in failed] == ["b", "e"]
    assert [r["run_key"] for r in run_named(data, "validations", {"scenario": "s2"}).to_pylist()] == ["e", "d"]


def test_update_keeps_edits_and_says_what_changed(built, store, tmp_path):
    model = tmp_path / "m.yaml"
    assert _cli("validate", "learn", "--data", built, "--out", model).exit_code == 0
    r = _cli("validate", "learn", "--data", built, "--out", model, "--update")
    assert r.exit_code == 0 and "unchanged: the runs confirm the previous model" in r.output
    model.write_text(model.read_text().replace("- name: finalize\n      essential: true",
                                               "- name: finalize\n      essential: false", 1))
    store.rows = []
    _runs(store, "info", [[("router", []), ("faq", []), ("club_info", [("club_info", None)]), ("finalize", [])]],
          prefix="new")
    data = store.write()
    build_store(data, idle_seconds=0)
    score_store(data)
    r = _cli("validate", "learn", "--data", data, "--out", model, "--update")
    assert r.exit_code == 0, r.output
    assert "changed: scenario info: new optional states: faq" in r.output, r.output
    text = model.read_text()
    assert "- name: finalize\n      essential: false\n      learned: essential" in text  # the edit survived
