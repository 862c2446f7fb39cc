"""deploy/: the Grafana dashboards against their schema and /metrics, the provisioning, Prometheus, compose."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from tracedag.pipeline.serve.metrics import compute

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARDS = sorted((DEPLOY / "grafana" / "dashboards").glob("*.json"))
_METRIC = re.compile(r"\b(tracedag_[a-z0-9_]+)")
_PROMQL_WORDS = {"sum", "by", "rate", "topk", "histogram_quantile", "le"}


def _exprs(dashboard: dict) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p["targets"]]


def test_there_are_analysis_and_collector_dashboards() -> None:
    assert {p.stem for p in DASHBOARDS} == {"tracedag-analysis", "tracedag-collector"}


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_each_dashboard_matches_the_schema_and_its_grid(path: Path) -> None:
    schema = json.loads((DEPLOY / "grafana" / "dashboard.schema.json").read_text())
    dashboard = json.loads(path.read_text())
    jsonschema.Draft202012Validator(schema).validate(dashboard)
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in dashboard["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"panel {p['title']!r} overlaps another"
        cells |= mine


def test_a_broken_dashboard_fails_the_schema() -> None:
    schema = json.loads((DEPLOY / "grafana" / "dashboard.schema.json").read_text())
    dashboard = json.loads(DASHBOARDS[0].read_text())
    dashboard["panels"][0]["gridPos"]["w"] = 30
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(dashboard, schema)


def test_every_metric_a_dashboard_plots_is_exported(serve_store: Path) -> None:
    served = set(_METRIC.findall(compute(serve_store)))
    # the collector registers its metrics by name in its modules (some only when the receivers start)
    sources = (DEPLOY.parent / "collector").glob("*.py")
    collector = {m for f in sources for m in re.findall(r'"(tracedag_[a-z0-9_]+)"', f.read_text())}
    collector |= {m + s for m in collector for s in ("_bucket", "_sum", "_count")}
    analysis = json.loads((DEPLOY / "grafana" / "dashboards" / "tracedag-analysis.json").read_text())
    for expr in _exprs(analysis):
        for metric in _METRIC.findall(expr):
            assert metric in served, (metric, expr)
    health = json.loads((DEPLOY / "grafana" / "dashboards" / "tracedag-collector.json").read_text())
    for expr in _exprs(health):
        for metric in _METRIC.findall(expr):
            assert metric in collector, (metric, expr)


def test_the_datasource_uid_is_the_one_the_dashboards_use() -> None:
    ds = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yaml").read_text())
    uids = {d["uid"] for d in ds["datasources"] if d["type"] == "prometheus"}
    for path in DASHBOARDS:
        for p in json.loads(path.read_text())["panels"]:
            assert p["datasource"]["uid"] in uids
    provider = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "dashboards" / "tracedag.yaml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"


@pytest.mark.skipif(shutil.which("promtool") is None,
                    reason="promtool (Debian package prometheus) is not installed: apt-get install prometheus")
def test_promtool_parses_every_expression_and_the_prometheus_config(tmp_path: Path) -> None:
    rules = {"groups": [{"name": path.stem, "rules": [{"record": f"tracedag:check:{i}", "expr": e}
                                                      for i, e in enumerate(_exprs(json.loads(path.read_text())))]}
                        for path in DASHBOARDS]}
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    done = subprocess.run(["promtool", "check", "rules", str(tmp_path / "rules.yml")], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
    # the config as compose mounts it, with the token secret where compose puts it
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    token = tmp_path / "token"
    token.write_text("x" * 32)
    for job in config["scrape_configs"]:
        if "authorization" in job:
            job["authorization"]["credentials_file"] = str(token)
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    done = subprocess.run(["promtool", "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()


def test_compose_starts_collect_serve_prometheus_and_grafana_with_files_that_exist() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.dashboards.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"collect", "serve", "prometheus", "grafana"}
    assert services["serve"]["entrypoint"][:2] == ["tracedag", "serve"]
    assert "--token-file" in services["serve"]["entrypoint"]
    assert any(v.endswith(":/data:ro") for v in services["serve"]["volumes"])
    for service in services.values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), volume
    prom = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    targets = {t for job in prom["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    assert targets == {"serve:8080", "collect:4318"}
