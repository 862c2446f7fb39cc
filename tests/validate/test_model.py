"""The model file: JSON and YAML round trips, every bad field named, what changed between two."""

from __future__ import annotations

import json

import pytest

from tests.validate.validate_support import run
from tracedag.pipeline.validate import read_model
from tracedag.pipeline.validate.learning import LearnOptions, learn_model
from tracedag.pipeline.validate.model import ModelInvalid, diff, save_model, to_dict


@pytest.fixture
def model():
    runs = [run("R", "A", "F"), run("R", "A", "B", "F")]
    return learn_model(runs, LearnOptions(state="node", agent="ag"), {"data": "d", "runs": None, "by": None})


@pytest.mark.parametrize("name", ["m.json", "m.yaml"])
def test_round_trip(tmp_path, model, name):
    path = tmp_path / name
    save_model(model, path)
    back = read_model(path)
    assert to_dict(back) == to_dict(model)
    assert back.agent == "ag" and back.scenarios["s"].essential == ["R", "A", "F"]
    text = path.read_text()
    assert "essential" in text and "tracedag-validation-model" in text


def _edit(tmp_path, model, change):
    raw = to_dict(model)
    change(raw)
    path = tmp_path / "m.json"
    path.write_text(json.dumps(raw))
    return path


@pytest.mark.parametrize(("change", "where", "reason"), [
    (lambda m: m["scenarios"]["s"]["states"][1].update(essential="yes"), "scenarios.s.states[1].essential",
     "must be true or false, got 'yes'"),
    (lambda m: m.update(version=2), "version", "2 is not supported"),
    (lambda m: m.update(format="x"), "format", "not a tracedag validation model"),
    (lambda m: m.update(state="words"), "state", "'words' is not one of step_key"),
    (lambda m: m["scenarios"]["s"]["states"][2].update(name="R"), "scenarios.s.states[2].name", "'R' appears twice"),
    (lambda m: m["scenarios"]["s"].pop("states"), "scenarios.s.states", "missing"),
    (lambda m: m["scenarios"]["s"]["states"][0].update(learned="maybe"), "scenarios.s.states[0].learned",
     "must be essential or optional"),
    (lambda m: m.update(scenarios={}), "scenarios", "is empty"),
    (lambda m: m.pop("agent"), "agent", "missing"),
])
def test_a_bad_field_is_named(tmp_path, model, change, where, reason):
    with pytest.raises(ModelInvalid) as e:
        read_model(_edit(tmp_path, model, change))
    assert e.value.where == where
    assert reason in str(e.value)
    assert "\n" not in str(e.value)


def test_not_json_at_all(tmp_path):
    path = tmp_path / "m.json"
    path.write_text("{oops")
    with pytest.raises(ModelInvalid, match="m.json: file: not valid JSON"):
        read_model(path)


def test_diff_lists_what_changed():
    opts = LearnOptions(state="node", agent="ag")
    runs = [run("R", "A", "F"), run("R", "A", "B", "F"), run("R", "C", "A", "F"), run("R", "A", "F"), run("R", "F")]
    model = learn_model(runs[:2], opts, {})
    assert diff(model, model) == []
    assert diff(model, learn_model(runs[:3], opts, {})) == ["scenario s: new optional states: C"]
    assert diff(model, learn_model(runs[:2] + runs[4:], opts, {})) == ["scenario s: no longer essential: A"]
    assert diff(model, learn_model(runs[:2] + runs[3:4], opts, {})) == ["scenario s: 1 new run(s), skeleton unchanged"]
