"""GET /metrics: strict text format (promtool), a real Prometheus scrape and PromQL, cached per build state."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.demo.demo_support import DemoRun, private_demo
from tests.serve.serve_support import Server, built_store, free_port, running_server
from tracedag.pipeline.dag.build import build_store
from tracedag.pipeline.serve.metrics import compute
from tracedag.pipeline.store.querying import run_named
from tracedag.pipeline.store.views import connect

_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (-?[0-9.e+-]+|\+Inf|NaN)$')


@pytest.fixture(scope="module")
def server(plain_server: Server) -> Server:
    """The worker's plain server of ``serve_store`` (tests/serve/serve_support.py): this module only reads."""
    return plain_server


def _agent_names(data: Path) -> dict[str, str]:
    """trace id -> agent name: the earliest agent_name among its spans (every generated span's service has one)."""
    con = connect(data)
    try:
        rows = con.sql("select trace_id, arg_min(agent_name, start_time_unix_nano) from spans "
                       "where agent_name is not null group by trace_id").fetchall()
    finally:
        con.close()
    return dict(rows)


def _expected_failures(data: Path) -> Counter[tuple[str, str, str, str]]:
    rows = run_named(data, "failures", {}).to_pylist()
    agents = _agent_names(data)
    return Counter((agents[r["trace_id"]], r["service_name"], r["step_type"], r["taxonomy_l1"] or "unclassified")
                   for r in rows if not r["recovered"])


def _samples(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        m = _LINE.match(line)
        assert m, f"not a sample line: {line!r}"
        out[m[1] + (m[2] or "")] = float(m[3])
    return out


def test_the_text_has_every_family_and_the_failure_counts(server: Server, serve_store: Path) -> None:
    r = server.client().get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = _samples(r.text)
    for family in ("tracedag_traces_built", "tracedag_failures", "tracedag_root_causes",
                   "tracedag_workflow_score", "tracedag_determinism", "tracedag_build_lag_seconds"):
        assert f"# TYPE {family} " in r.text
    expected = _expected_failures(serve_store)
    assert expected
    for (agent, service, step, category), n in expected.items():
        key = f'tracedag_failures{{agent="{agent}",service="{service}",step_type="{step}",category="{category}"}}'
        assert samples[key] == n
    built = run_named(serve_store, "trace_summary", {}).num_rows
    assert samples["tracedag_traces_built"] == built
    counts = sum(v for k, v in samples.items() if k.startswith("tracedag_workflow_score_count"))
    assert counts == built


@pytest.mark.skipif(shutil.which("promtool") is None,
                    reason="promtool (Debian package prometheus) is not installed: apt-get install prometheus")
def test_promtool_accepts_the_text(server: Server) -> None:
    text = server.client().get("/metrics").text
    done = subprocess.run(["promtool", "check", "metrics"], input=text.encode(), capture_output=True, timeout=60)
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()


def test_a_scrape_between_builds_is_served_from_the_cache(tmp_path: Path) -> None:
    data = built_store(tmp_path / "store", spans=600, seed=7)
    with running_server(data) as s:
        c = s.client()
        first = c.get("/metrics").text
        t0 = time.perf_counter()
        second = c.get("/metrics").text
        cached_seconds = time.perf_counter() - t0
        assert second == first  # the same text, compute time included: nothing was recomputed
        assert cached_seconds < 0.5
        from bench.gen import make_store
        make_store(data, 600, seed=8)  # more spans, then a build: a new build state
        build_store(data, idle_seconds=0.0)
        third = _samples(c.get("/metrics").text)
        assert third["tracedag_traces_built"] > _samples(first)["tracedag_traces_built"]


@pytest.mark.skipif(shutil.which("prometheus") is None,
                    reason="prometheus (Debian package prometheus) is not installed: apt-get install prometheus")
def test_a_real_prometheus_scrapes_and_promql_returns_the_failure_count(
        server: Server, serve_store: Path, tmp_path: Path) -> None:
    port = free_port()
    target = server.url.removeprefix("http://")
    config = tmp_path / "prometheus.yml"
    config.write_text(f"global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: tracedag\n"
                      f"    static_configs:\n      - targets: ['{target}']\n")
    proc = subprocess.Popen(["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    expected = sum(_expected_failures(serve_store).values())
    try:
        deadline = time.monotonic() + 60
        got = None
        while time.monotonic() < deadline:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/api/v1/query", params={"query": "sum(tracedag_failures)"})
                result = r.json()["data"]["result"] if r.status_code == 200 else []
            except httpx.HTTPError:
                result = []
            if result:
                got = float(result[0]["value"][1])
                break
            time.sleep(0.5)
        assert got == expected
        r = httpx.get(f"http://127.0.0.1:{port}/api/v1/query",
                      params={"query": 'sum by (agent) (tracedag_workflow_score_count)'})
        assert sum(float(x["value"][1]) for x in r.json()["data"]["result"]) == \
            run_named(serve_store, "trace_summary", {}).num_rows
    finally:
        proc.terminate()
        proc.wait(20)


_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def _series(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample line as (metric, labels, value)."""
    out = []
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        m = _LINE.match(line)
        assert m, f"not a sample line: {line!r}"
        out.append((m[1], dict(_LABEL.findall(m[2] or "")), float(m[3])))
    return out


@pytest.fixture(scope="module")
def demo_store(demo_newcomer: DemoRun, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's store: agents with a name other than their service, determinism over replays and variants.

    ``tracedag demo`` (seed 7) runs once per test run (tests/demo/demo_support.py); this module reads a copy.
    """
    return private_demo(demo_newcomer, tmp_path_factory.mktemp("serve-demo") / "newcomer").data


def test_one_sample_per_label_set_and_agent_is_the_agent_name_everywhere(serve_store: Path, demo_store: Path) -> None:
    for data in (serve_store, demo_store):
        series = _series(compute(data))
        keys = Counter((name, tuple(sorted(labels.items()))) for name, labels, _ in series)
        assert [k for k, n in keys.items() if n > 1] == []
        agents = set(_agent_names(data).values())
        services = set(run_named(data, "trace_summary", {}).column("service_name").to_pylist())
        assert agents.isdisjoint(services)  # the two stores name agents and services apart: a mix-up shows
        labelled = [(name, labels) for name, labels, _ in series if "agent" in labels]
        assert {n.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count") for n, _ in labelled} >= {
            "tracedag_failures", "tracedag_root_causes", "tracedag_workflow_score", "tracedag_build_lag_seconds"}
        for name, labels in labelled:
            assert labels["agent"] in agents, (name, labels)
            assert set(labels["service"].split(",")) <= services, (name, labels)


def test_determinism_keeps_version_and_comparison_and_response_has_its_own_scale(demo_store: Path) -> None:
    text = compute(demo_store)
    rows = run_named(demo_store, "determinism_agent", {}).to_pylist()
    assert {r["comparison"] for r in rows} == {"replays", "variants"}
    got = {(s[1]["agent"], s[1]["agent_version"], s[1]["comparison"], s[1]["kind"]): s[2]
           for s in _series(text) if s[0] == "tracedag_determinism"}
    response = {(s[1]["agent"], s[1]["agent_version"], s[1]["comparison"]): s[2]
                for s in _series(text) if s[0] == "tracedag_response_consistency"}
    for r in rows:
        for kind in ("node_consistency", "action_consistency", "action_input_consistency"):
            if r[kind] is not None:
                assert got[(r["agent"], r["agent_version"] or "", r["comparison"], kind)] == pytest.approx(r[kind])
        if r["response_consistency"] is not None:
            assert response[(r["agent"], r["agent_version"] or "", r["comparison"])] == \
                pytest.approx(r["response_consistency"])
    assert got and all(0 <= v <= 1 for v in got.values())
    assert response and all(1 <= v <= 4 for v in response.values())
    assert "# HELP tracedag_determinism Consistency across runs of a scenario (0..1)" in text
    assert "# HELP tracedag_response_consistency Agreement of the responses across runs of a scenario (1..4" in text
    if shutil.which("promtool"):
        done = subprocess.run(["promtool", "check", "metrics"], input=text.encode(), capture_output=True, timeout=60)
        assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
