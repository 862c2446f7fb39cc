"""GET /metrics: strict text format (promtool), a real Prometheus scrape and PromQL, cached per build state."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.serve.serve_support import Server, built_store, free_port, running_server
from tracedag.pipeline.dag.build import build_store
from tracedag.pipeline.store.querying import run_named

_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (-?[0-9.e+-]+|\+Inf|NaN)$')


@pytest.fixture(scope="module")
def server(serve_store: Path) -> Iterator[Server]:
    with running_server(serve_store) as s:
        yield s


def _expected_failures(data: Path) -> Counter[tuple[str, str, str]]:
    rows = run_named(data, "failures", {}).to_pylist()
    return Counter((r["service_name"], r["step_type"], r["taxonomy_l1"] or "unclassified")
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
    for (agent, step, category), n in expected.items():
        assert samples[f'tracedag_failures{{agent="{agent}",step_type="{step}",category="{category}"}}'] == n
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
