"""The ``cost_usd`` metric of ``tracedag regress``: the same tokens on a pricier model fail the gate.

Every trace of a version carries 100 input and 50 output tokens on its root span, with the version's
model. Per trace, at the price list of queries/_costs.sql (USD per 1M tokens):
  gpt-4o-mini  0.15 / 0.60:  (100 * 0.15 + 50 * 0.60) / 1e6 =  45e-6
  gpt-4o       2.50 / 10.00: (100 * 2.50 + 50 * 10.0) / 1e6 = 750e-6
  my-llama     not listed: the config's default prices, 0 / 0 unless set; at 20 / 40:
               (100 * 20 + 50 * 40) / 1e6 = 4000e-6
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tests.regress.regress_support import gate_store
from tracedag.pipeline.cli import cli
from tracedag.pipeline.regress import RegressConfig, RegressError, run_regress
from tracedag.pipeline.regress.config import parse_config

MINI, FULL, LOCAL = 45e-6, 750e-6, 4000e-6


@pytest.fixture(scope="module")
def cost_gate_store(tmp_path_factory):
    return gate_store(tmp_path_factory.mktemp("regress-cost") / "data", {
        "mini": {"model": "gpt-4o-mini-2024-07-18"}, "mini2": {"model": "gpt-4o-mini-2024-07-18"},
        "full": {"model": "gpt-4o-2024-08-06"}, "local": {"model": "my-llama"},
    })


def _json(data, base, cand, *extra):
    out = CliRunner().invoke(cli, ["regress", "--data", str(data), "--baseline", base, "--candidate", cand,
                                   "--format", "json", *extra], catch_exceptions=False)
    return out.exit_code, json.loads(out.output)


def _metric(doc, name):
    return next(m for m in doc["metrics"] if m["metric"] == name)


def test_a_pricier_model_fails_the_gate_on_cost(cost_gate_store):
    code, doc = _json(cost_gate_store, "service_version=mini", "service_version=full")
    assert code == 1
    cost = _metric(doc, "cost_usd")
    assert cost["baseline_mean"] == pytest.approx(MINI) and cost["candidate_mean"] == pytest.approx(FULL)
    assert cost["delta"] == pytest.approx(FULL - MINI) and cost["pairs"] == 16
    assert cost["fail_at"] == pytest.approx(0.25 * MINI) and cost["warn_at"] == pytest.approx(0.10 * MINI)
    assert cost["status"] == "fail"
    assert _metric(doc, "tokens")["status"] == "ok"  # the same tokens: only the price changed
    assert [m["metric"] for m in doc["metrics"] if m["status"] == "fail"] == ["cost_usd"]


def test_the_cheaper_model_improves_and_the_same_model_passes(cost_gate_store):
    code, doc = _json(cost_gate_store, "service_version=full", "service_version=mini")
    assert code == 0 and _metric(doc, "cost_usd")["status"] == "improved"
    code, doc = _json(cost_gate_store, "service_version=mini", "service_version=mini2")
    assert code == 0 and _metric(doc, "cost_usd")["status"] == "ok"
    assert _metric(doc, "cost_usd")["delta"] == pytest.approx(0.0, abs=1e-15)


def test_default_prices_for_an_unlisted_model_come_from_the_config(cost_gate_store, tmp_path):
    code, doc = _json(cost_gate_store, "service_version=mini", "service_version=local")
    assert code == 0
    free = _metric(doc, "cost_usd")
    assert free["candidate_mean"] == 0.0 and free["status"] == "improved"  # 0 / 0 by default
    config = tmp_path / "regress.yaml"
    config.write_text("default_input_per_mtok: 20\ndefault_output_per_mtok: 40\n")
    code, doc = _json(cost_gate_store, "service_version=mini", "service_version=local", "--config", str(config))
    assert code == 1
    priced = _metric(doc, "cost_usd")
    assert priced["candidate_mean"] == pytest.approx(LOCAL) and priced["status"] == "fail"


def test_cost_thresholds_and_prices_are_config_keys(cost_gate_store):
    config = parse_config({"default_output_per_mtok": 1.5, "metrics": {"cost_usd": {"fail_rel": 100.0}}})
    assert (config.default_input_per_mtok, config.default_output_per_mtok) == (0.0, 1.5)
    result = run_regress(cost_gate_store, "service_version=mini", "service_version=full", config.replace(resamples=300))
    cost = next(m for m in result.metrics if m.metric == "cost_usd")
    assert cost.status == "warn"  # +1567% is beyond the 10% warn level, short of the raised 10000% fail level
    with pytest.raises(RegressError, match="default_input_per_mtok must be >= 0"):
        parse_config({"default_input_per_mtok": -1})
    assert RegressConfig().thresholds("cost_usd").direction == "lower"
