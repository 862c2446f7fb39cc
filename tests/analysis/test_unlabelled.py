"""Production-like stores without run labels: every run of an agent in one scenario (thousands of
runs), the linear determinism over them, and the hint that suggests --group-by."""

from __future__ import annotations

import json
from math import comb

import pytest
from click.testing import CliRunner

from tracedag.pipeline.analysis.determinism import analyze
from tracedag.pipeline.analysis.pairs import bound
from tracedag.pipeline.analysis.response import OFFLINE_METHOD, OFFLINE_SAMPLED_METHOD
from tracedag.pipeline.analysis.trajectories import UNLABELLED
from tracedag.pipeline.cli import cli

HINT = "group them with --group-by, e.g. tracedag determinism --group-by \"attributes['app.intent']\""


def _invoke(data, *args):
    res = CliRunner().invoke(cli, ["determinism", "--data", str(data), *args], env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    return res.output


def unlabelled_runs(store, n):
    """n one-turn runs without run or scenario labels. Even runs call the tools common() and
    own(i=...), odd runs only own(i=...); the replies follow the same pattern ("common w<i>" or
    "w<i>"). So every pair of even runs has action+input and reply Jaccard 1/3, every other pair 0."""
    for i in range(n):
        own = ("own", json.dumps({"i": i}))
        tools = [("common", None), own] if i % 2 == 0 else [own]
        reply = f"common w{i}" if i % 2 == 0 else f"w{i}"
        store.turn({}, [("A", tools)], reply)
    return store.write()


def test_thousands_of_runs_in_one_scenario_stay_linear_and_correct(store):
    # One scenario of 4,000 runs whose action+input sets and replies are all distinct: the exact
    # means compare 8 million pairs (minutes in the old quadratic SQL and Python); the estimates
    # draw 40,000 pairs each.
    n = 4000
    data = unlabelled_runs(store, n)
    result = analyze(data)
    assert len(result.runs) == n
    (row,) = result.tables["determinism"].to_pylist()
    assert (row["scenario"], row["comparison"], row["runs"]) == (UNLABELLED, "replays", n)
    even_pairs = comb(n // 2, 2) / comb(n, 2)
    assert row["coverage_estimated"] == ["action_input"]
    assert abs(row["action_input_coverage"] - even_pairs / 3) < bound(0.999)
    assert row["response_consistency_method"] == OFFLINE_SAMPLED_METHOD
    assert abs(row["response_consistency"] - (1 + even_pairs)) < 3 * bound(0.999)
    # two distinct action sets and one node set: exact, as before
    assert row["action_coverage"] == pytest.approx((comb(n // 2, 2) * 2 + (n // 2) ** 2 / 2) / comb(n, 2))
    assert row["action_consistency"] == pytest.approx(0.5)  # tie of [own] and [common, own]: shorter
    assert row["base_action_path"] == ["own"]
    assert row["node_coverage"] == 1.0 and row["node_consistency"] == 1.0
    assert analyze(data).tables["determinism"].to_pylist() == [row]  # seeded: the same figures again
    out = _invoke(data)
    assert f"≈{row['action_input_coverage']:.2f}" in out and "≈ estimated: more than 40,000 pairs" in out
    assert f"{n:,} of {n:,} runs have no scenario label" in out and HINT in out


def test_unlabelled_runs_get_one_line_suggesting_group_by(store):
    for i in range(3):
        store.turn({}, [("A", [("t", None)])], f"reply {i}")
    data = store.write()
    out = _invoke(data)
    assert "3 of 3 runs have no scenario label (tracedag.scenario_id), so they count as one scenario " \
           f"{UNLABELLED}: {HINT}" in out.replace("\n", " ")
    assert "≈" not in out and "estimated" not in out
    # grouped by an expression over the root span: no hint, one scenario per value
    grouped = _invoke(data, "--group-by", "name")
    assert "--group-by" not in grouped and "invoke_agent agentA" in grouped


def test_labelled_runs_get_no_hint(store):
    store.run("r1", "s1", [[("A", [])]], replay=0, responses=["ok"])
    store.run("r2", "s1", [[("A", [])]], replay=1, responses=["ok"])
    out = _invoke(store.write())
    assert "--group-by" not in out
    result = analyze(store.data)
    (row,) = result.tables["determinism"].to_pylist()
    assert row["coverage_estimated"] == [] and row["response_consistency_method"] == OFFLINE_METHOD


def test_analysis_reports_progress_per_phase(store):
    data = unlabelled_runs(store, 6)
    events = []
    result = analyze(data, progress=lambda phase, done, total: events.append((phase, done, total)))
    done = {}
    for phase, n, _ in events:
        done[phase] = done.get(phase, 0) + n
    steps = sum(len(r.nodes) + len(r.actions) + r.turns for r in result.runs)  # nodes, tools, replies
    assert done == {"reading run steps": steps, "determinism and utility queries": 6, "response consistency": 1}
    assert events[0] == ("reading run steps", 0, None)  # shown before the spans are read
    assert ("response consistency", 1, 1) in events
