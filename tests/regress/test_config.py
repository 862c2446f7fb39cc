"""regress.yaml: defaults, overrides, and every malformed config refused with a clear message."""

from __future__ import annotations

import pytest

from tracedag.pipeline.regress import RegressError, load_config, parse_config
from tracedag.pipeline.regress.model import FAMILIES


def test_defaults_and_overrides(tmp_path):
    path = tmp_path / "regress.yaml"
    path.write_text("""
resamples: 500
confidence: 0.9
seed: 4
pair_by: [scenario_id]
metrics:
  workflow_score: {warn: 0.2, fail: 0.4}
  latency_p95: {enabled: false}
  "step_score[tool=search]": {fail: 1.0, warn: 0.5}
""")
    config = load_config(path)
    assert (config.resamples, config.confidence, config.seed, config.pair_by) == (500, 0.9, 4, ("scenario_id",))
    assert config.thresholds("workflow_score").level("fail", 4.0) == 0.4
    assert not config.thresholds("latency_p95").enabled
    assert config.thresholds("step_score[tool=search]").fail == 1.0
    assert config.thresholds("step_score[type=tool]") == FAMILIES["step_score"].thresholds
    assert load_config(None).resamples == 2000
    assert config.replace(seed=9, resamples=None).seed == 9


def test_absolute_override_replaces_relative_levels():
    config = parse_config({"metrics": {"latency_p50": {"warn": 5, "fail": 10}}})
    t = config.thresholds("latency_p50")
    assert (t.warn_rel, t.fail_rel, t.direction) == (0.0, 0.0, "lower")
    assert t.level("fail", 1000.0) == 10


@pytest.mark.parametrize(("text", "message"), [
    ("resamples: many", "resamples must be an integer"),
    ("confidence: 1.5", "confidence must be below 1"),
    ("bogus: 1", "unknown key(s) bogus"),
    ("pair_by: [colour]", "pair_by must be a list of"),
    ("metrics: {nope: {warn: 1}}", "no such metric family"),
    ("metrics: {workflow_score: {warm: 1}}", "unknown key(s) warm"),
    ("metrics: {workflow_score: {warn: 0.5, fail: 0.1}}", "fail level is below the warn level"),
    ("metrics: {workflow_score: {direction: up}}", "direction must be"),
    ("metrics: {workflow_score: 3}", "expected a mapping"),
    ("[1, 2]", "expected a mapping at the top"),
    ("resamples: [", "regress.yaml"),
    ("correction: bonferroni", "correction must be bh, holm or none"),
])
def test_malformed_config_is_refused(tmp_path, text, message):
    path = tmp_path / "regress.yaml"
    path.write_text(text)
    with pytest.raises(RegressError, match="regress.yaml") as err:
        load_config(path)
    assert message in str(err.value)
