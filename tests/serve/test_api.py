"""tracedag serve as a real process: named queries in four formats, traces, OpenAPI, the token."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from tests.serve.serve_support import Server, running_server
from tracedag.pipeline.cli import cli
from tracedag.pipeline.store.querying import run_named

TOKEN = "s3cret-token-of-the-test"


@pytest.fixture(scope="module")
def server(serve_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server for the module, with a token: ``client()`` carries it, so every test reads the API as an
    authorized client, and the token test needs no server of its own (each costs ~4 s of CPU to start).
    Serving on loopback without a token is what test_ui and the other serve tests do."""
    with running_server(serve_store, token=TOKEN, tmp=tmp_path_factory.mktemp("api-token")) as s:
        yield s


def test_every_named_query_is_listed_with_its_params(server: Server) -> None:
    listed = {q["name"]: q for q in server.client().get("/api/queries").json()}
    assert {"failures", "root_causes", "trace_summary", "step_stats"} <= set(listed)
    params = {p["name"]: p for p in listed["failures"]["params"]}
    assert params["fail_threshold"]["type"] == "double" and listed["failures"]["since"] is True


@pytest.mark.parametrize("fmt", ["json", "csv", "arrow", "parquet"])
def test_a_named_query_in_each_format_has_the_in_process_rows(server: Server, serve_store: Path, fmt: str) -> None:
    expected = run_named(serve_store, "failures", {"fail_threshold": "2.5"})
    r = server.client().get("/api/queries/failures", params={"fail_threshold": "2.5", "format": fmt})
    assert r.status_code == 200, r.text
    if fmt == "json":
        got = r.json()
        assert len(got) == expected.num_rows > 0
        assert sorted(x["span_id"] for x in got) == sorted(expected.column("span_id").to_pylist())
        return
    table = {"csv": lambda b: pacsv.read_csv(io.BytesIO(b)), "arrow": lambda b: pa.ipc.open_stream(b).read_all(),
             "parquet": lambda b: pq.read_table(io.BytesIO(b))}[fmt](r.content)
    assert table.num_rows == expected.num_rows
    assert sorted(table.column("span_id").to_pylist()) == sorted(expected.column("span_id").to_pylist())


def test_nested_columns_go_to_csv_as_json_text(server: Server) -> None:
    r = server.client().get("/api/queries/propagation", params={"format": "csv"})
    assert r.status_code == 200, r.text
    table = pacsv.read_csv(io.BytesIO(r.content))
    ups = [json.loads(v) for v in table.column("failing_upstream").to_pylist() if v is not None]
    assert ups and all(isinstance(u, list) for u in ups)


def test_query_errors_are_400_or_404_with_the_reason(server: Server) -> None:
    c = server.client()
    bad = c.get("/api/queries/failures", params={"fail_threshold": "high"})
    assert bad.status_code == 400 and "is not a double" in bad.json()["error"]
    assert c.get("/api/queries/failures", params={"nope": "1"}).status_code == 400
    assert c.get("/api/queries/no_such_query").status_code == 404
    assert c.get("/api/queries/failures", params={"format": "xml"}).status_code == 400


def test_the_trace_list_filters(server: Server, serve_store: Path) -> None:
    c = server.client()
    everything = c.get("/api/traces", params={"limit": 10_000}).json()
    summary = run_named(serve_store, "trace_summary", {})
    assert everything["total"] == summary.num_rows == len(everything["traces"])
    starts = [t["start_time_unix_nano"] for t in everything["traces"]]
    assert starts == sorted(starts, reverse=True)
    failed = c.get("/api/traces", params={"status": "failed", "limit": 10_000}).json()
    assert failed["total"] == sum(1 for p in summary.column("passed").to_pylist() if p is False) > 0
    assert all(t["passed"] is False for t in failed["traces"])
    agent = everything["traces"][0]["service_name"]
    by_agent = c.get("/api/traces", params={"agent": agent, "limit": 10_000}).json()
    assert 0 < by_agent["total"] < everything["total"] and {t["service_name"] for t in by_agent["traces"]} == {agent}
    conv = everything["traces"][0]["conversation_id"]
    assert {t["conversation_id"] for t in c.get("/api/traces", params={"conversation": conv}).json()["traces"]} == {conv}
    assert c.get("/api/traces", params={"since": "1h"}).json()["total"] == 0  # the generator's times are in 2025
    page = c.get("/api/traces", params={"limit": 3, "offset": 2}).json()["traces"]
    assert [t["trace_id"] for t in page] == [t["trace_id"] for t in everything["traces"][2:5]]


def test_injection_in_a_filter_matches_nothing(server: Server) -> None:
    for evil in ["' OR 1=1 --", "x' or '1'='1"]:
        r = server.client().get("/api/traces", params={"agent": evil})
        assert r.status_code == 200 and r.json()["total"] == 0
        assert server.client().get(f"/api/traces/{evil}").status_code == 404


def test_one_trace_has_its_dag_scores_failures_and_root_cause(server: Server) -> None:
    c = server.client()
    every = c.get("/api/traces", params={"limit": 10_000}).json()["traces"]
    with_root = max((t for t in every if t["root_cause_span_id"]), key=lambda t: t["unrecovered_failures"])
    doc = c.get(f"/api/traces/{with_root['trace_id']}").json()
    assert doc["trace"]["trace_id"] == with_root["trace_id"]
    assert len(doc["nodes"]) == with_root["steps"] and len(doc["spans"]) == with_root["span_count"]
    node_ids = {n["span_id"] for n in doc["nodes"]}
    assert doc["edges"] and all(e["source"] in node_ids and e["target"] in node_ids for e in doc["edges"])
    assert doc["root_cause"]["root_span_id"] == with_root["root_cause_span_id"]
    assert doc["propagation_chain"][0] == with_root["root_cause_span_id"]
    assert doc["propagation_chain"][-1] == doc["root_cause"]["failed_span_id"]
    assert {f["span_id"] for f in doc["failures"]} >= set(doc["propagation_chain"])
    assert json.loads(doc["spans"][0]["attributes"])  # attributes as a JSON object
    assert any(s["score"] is not None for s in doc["scores"])
    assert c.get("/api/traces/0123456789abcdef0123456789abcdef").status_code == 404


def test_openapi_describes_every_route_and_query(server: Server) -> None:
    spec = server.client().get("/openapi.json").json()
    assert spec["openapi"].startswith("3.")
    assert {"/api/queries", "/api/traces", "/api/traces/{trace_id}", "/api/sql", "/metrics"} <= set(spec["paths"])
    failures = spec["paths"]["/api/queries/failures"]["get"]["parameters"]
    assert {"fail_threshold", "since", "format"} <= {p["name"] for p in failures}


def test_beyond_loopback_a_token_is_required(serve_store: Path) -> None:
    out = CliRunner().invoke(cli, ["serve", "--data", str(serve_store), "--host", "0.0.0.0"])
    assert out.exit_code == 2 and "--token-file" in out.output


def test_with_a_token_every_request_must_carry_it(server: Server) -> None:
    import httpx

    assert server.token == TOKEN
    assert httpx.get(f"{server.url}/api/queries").status_code == 401
    assert httpx.get(f"{server.url}/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert server.client().get("/api/queries").status_code == 200
    assert server.client().get("/metrics").status_code == 200


def test_the_demo_line_counts_the_traces_and_its_report_command_runs(serve_store: Path, tmp_path: Path) -> None:
    import re
    import shlex

    from tracedag.pipeline.demo.config import DemoResult
    from tracedag.pipeline.demo.report import serve_line

    built = run_named(serve_store, "trace_summary", {}).num_rows
    line = serve_line(DemoResult(data=serve_store, counts={"traces": built}))
    assert line.startswith(f"dashboards: {built} built traces") and "tracedag serve --data" in line
    report = re.search(r"(tracedag report .*)$", line)
    assert report
    args = shlex.split(report.group(1).replace("report.html", str(tmp_path / "r.html")))[1:]
    done = CliRunner().invoke(cli, args)
    assert done.exit_code == 0 and f"{built} traces listed" in done.output, done.output


def test_a_trace_document_reads_the_latest_build_like_the_views(server: Server, serve_store: Path) -> None:
    from tracedag.pipeline.store.views import connect

    con = connect(serve_store)
    ids = [r[0] for r in con.sql("select trace_id from traces order by trace_id limit 12").fetchall()]
    for tid in ids:
        doc = server.client().get(f"/api/traces/{tid}").json()
        nodes = con.sql("select n.span_id, min(s.score) from dag_nodes n left join step_scores s using (trace_id, span_id) "
                        "where n.trace_id = $t group by n.span_id", params={"t": tid}).fetchall()
        assert sorted((n["span_id"], n["score"]) for n in doc["nodes"]) == sorted(nodes)
        edges = con.sql("select upstream_span_id, downstream_span_id from dag_edges where trace_id = $t",
                        params={"t": tid}).fetchall()
        assert sorted((e["source"], e["target"]) for e in doc["edges"]) == sorted(edges)
        scores = con.sql("select count(*) from step_scores where trace_id = $t", params={"t": tid}).fetchall()[0][0]
        assert len(doc["scores"]) == scores
    con.close()
