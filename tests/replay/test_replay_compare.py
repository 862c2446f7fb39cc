"""Replays compare with what they replay: the example agent's traffic (labelled with scenarios and replay
indexes, or not labelled at all) stored through the real collector, replayed by ``tracedag replay``,
built, scored, then ``tracedag regress`` pairs each original with its replay, ``tracedag validate learn``
leaves the replays out, and ``tracedag validate check`` checks them against the originals' model."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from click.testing import CliRunner

from tests.dag.spanbuild import q
from tests.replay.replay_support import BOOKING_TURNS, INFO_TURNS, example_store, in_process
from tracedag.pipeline.cli import cli
from tracedag.pipeline.dag import build_store
from tracedag.pipeline.score import score_store

REPLAY = ("--agent", "example", "--agent-opt", "fault_rate=0", "--agent-opt", "noise=0",
          "--label", "service_version=candidate")
LABELLED = {f"{s}-r{i}": {"scenario_id": s, "replay_index": i} for s in ("book", "info") for i in range(2)}


def _turns(cid):
    return BOOKING_TURNS if cid.startswith("book") else INFO_TURNS


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    """Four original runs, two scenarios x replay index 0..1, replayed once each, built and scored."""
    data = example_store(tmp_path_factory.mktemp("lab") / "data", {c: _turns(c) for c in LABELLED}, labels=LABELLED)
    _replay_and_build(data, "--times", "1", "--replay-id", "rl")
    return data


@pytest.fixture(scope="module")
def unlabelled(tmp_path_factory):
    """Three conversations without run labels, replayed twice each, built and scored."""
    convs = {"c-book": BOOKING_TURNS, "c-book2": BOOKING_TURNS, "c-info": INFO_TURNS}
    data = example_store(tmp_path_factory.mktemp("unl") / "data", convs)
    _replay_and_build(data, "--times", "2", "--replay-id", "ru")
    return data


def _replay_and_build(data, *args):
    """``tracedag replay`` (through click's runner: its process is test_replay_cli's), then the build and the
    scoring, all in this process (their commands' own process tests are elsewhere)."""
    res = in_process("replay", "--data", data, *REPLAY, *args)
    assert res.returncode == 0, res.stdout + res.stderr
    build_store(data, idle_seconds=0)
    score_store(data)


def _tracedag(*args) -> subprocess.CompletedProcess[str]:
    """``tracedag ARGS`` (regress, validate) in this process; test_demo_hints runs both as processes, printed."""
    done = CliRunner().invoke(cli, [str(a) for a in args], env={"COLUMNS": "200"})
    return subprocess.CompletedProcess(args, done.exit_code, done.stdout, done.stderr)


def _regress(data):
    res = _tracedag("regress", "--data", data, "--baseline", "service_version=1.0", "--candidate",
                       "service_version=candidate", "--format", "json", "--no-save")
    assert res.returncode in (0, 1), res.stdout + res.stderr  # 2 would be "no common cases"
    return json.loads(res.stdout)


def test_a_replay_keeps_the_source_labels_and_names_its_source(labelled):
    rows = q(labelled, """select conversation_id, any_value(scenario_id), any_value(replay_index),
                                 any_value(attributes['tracedag.source_conversation_id']),
                                 any_value(attributes['tracedag.source_trace_id']) is not null
                          from spans where run_id like 'rl/%' group by 1 order by 1""")
    assert rows == [(f"rl/{s}-r{i}/r0", s, i, f"{s}-r{i}", True) for s in ("book", "info") for i in range(2)]
    # the source label is a run label every selection reads (regress, validate --runs)
    res = _tracedag("regress", "--data", labelled, "--baseline", "sql:t.service_version = '1.0'",
                       "--candidate", "source_conversation_id=book-r1", "--format", "json", "--no-save")
    assert json.loads(res.stdout)["candidate"]["traces"] == 1, res.stdout + res.stderr


def test_regress_pairs_each_labelled_run_with_its_replay(labelled):
    result = _regress(labelled)
    assert result["pair_by"] == ["scenario_id", "replay_index"]
    assert result["paired_cases"] == 4
    assert result["unpaired"] == {"baseline": [], "candidate": []}


def test_regress_pairs_unlabelled_conversations_with_their_replays(unlabelled):
    result = _regress(unlabelled)
    assert result["paired_cases"] == 3  # one case per conversation: the original and its two replays
    assert result["unpaired"] == {"baseline": [], "candidate": []}


def test_validate_learns_from_the_originals_and_checks_the_replays(labelled, tmp_path):
    model = tmp_path / "model.json"
    learned = _tracedag("validate", "learn", "--data", labelled, "--out", model)
    assert learned.returncode == 0, learned.stdout + learned.stderr
    assert "left out 4 replayed run(s)" in learned.stdout
    doc = json.loads(model.read_text())
    learned_runs = sorted(r for s in doc["scenarios"].values() for r in s["runs"])
    assert learned_runs == sorted(LABELLED)  # the originals' runs (run key = conversation), no replay
    checked = _tracedag("validate", "check", "--data", labelled, "--model", model,
                           "--runs", "service_version=candidate")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    rows = q(labelled, "select run_key, scenario, passed from validations order by 1")
    assert rows == [(f"rl/{s}-r{i}/r0", s, True) for s in ("book", "info") for i in range(2)]


def test_validate_learns_from_replays_only_when_asked(labelled, tmp_path):
    only = _tracedag("validate", "learn", "--data", labelled, "--runs", "service_version=candidate",
                        "--out", tmp_path / "m.json")
    assert only.returncode == 2 and "--include-replays" in only.stderr, only.stdout + only.stderr
    asked = _tracedag("validate", "learn", "--data", labelled, "--runs", "service_version=candidate",
                         "--include-replays", "--min-runs", "1", "--out", tmp_path / "m.json")
    assert asked.returncode == 0, asked.stdout + asked.stderr
    doc = json.loads((tmp_path / "m.json").read_text())
    assert sorted(r for s in doc["scenarios"].values() for r in s["runs"]) == [
        f"rl/{s}-r{i}/r0" for s in ("book", "info") for i in range(2)]


def test_replays_of_unlabelled_conversations_are_checked_under_their_source_scenario(unlabelled, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(unlabelled, data)
    model = tmp_path / "model.json"
    learned = _tracedag("validate", "learn", "--data", data, "--out", model, "--min-runs", "1")
    assert learned.returncode == 0, learned.stdout + learned.stderr
    assert list(json.loads(model.read_text())["scenarios"]) == ["(unlabelled)"]
    checked = _tracedag("validate", "check", "--data", data, "--model", model, "--runs",
                           "service_version=candidate")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    rows = q(data, "select scenario, count(*), count(passed) from validations group by 1")
    assert rows == [("(unlabelled)", 6, 6)]  # every replay judged (none "no model for scenario")
