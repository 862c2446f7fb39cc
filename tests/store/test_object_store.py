"""Stores on object storage (issue #23): a real S3 server (SeaweedFS), real collectors and exporters, real DuckDB over s3fs.

The S3 server killed mid-upload loses nothing acknowledged; two work directories cannot share a writer id;
compaction and eviction keep the manifest right; a store that cannot be used is one clear line; serve and
saved reports work over the store. Two collectors writing one S3 store that is then built on Ray is in
tests/engine/test_ray.py (it joins that module's Ray cluster).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

from tests.collector.collector_support import start_process, stop_process, wait_until
from tests.store.objfixtures import agent_traces, otel_provider, sorted_rows
from tests.store.objfixtures import quick_module_server as s3_module_server  # noqa: F401  (the module's SeaweedFS)
from tests.store.s3_server import agent_runs_dump
from tracedag.pipeline.cli import cli
from tracedag.pipeline.store.listing import read_listing
from tracedag.pipeline.store.manifests import publish
from tracedag.pipeline.store.remote import attach, open_remote

CLI = [sys.executable, "-c", "from tracedag.pipeline.cli import cli; cli()"]


def _run(*args: str, check: bool = True, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env=os.environ.copy())
    if check:
        assert r.returncode == 0, r.stdout + r.stderr
    return r


def _in_process(*args: str) -> None:
    """``tracedag ARGS`` in this process, where a separate one proves nothing more (no exit status, output or crash
    under test): it saves a process start and its imports."""
    done = CliRunner().invoke(cli, list(args))
    assert done.exit_code == 0, done.output


def test_s3_killed_mid_upload_loses_nothing_acked(s3, tmp_path):
    url = f"s3://{s3.bucket}/store"
    spool = tmp_path / "spool"
    proc, http, _ = start_process(url, "--spool", str(spool), "--collector-id", "c1",
                                  env={"TRACEDAG_REMOTE_GRACE": "0"})
    sent = 0
    try:
        provider = otel_provider(HttpExporter(endpoint=f"http://127.0.0.1:{http}/v1/traces"))
        agent_traces(provider, 0, 10)
        sent += 40
        s3.kill()  # the publisher's uploads now fail; the collector keeps acknowledging
        agent_traces(provider, 10, 10)
        sent += 40
        provider.force_flush()
        time.sleep(2.0)  # a few publish rounds fail meanwhile
        s3.start()
        agent_traces(provider, 20, 10)
        sent += 40
        provider.shutdown()
        reader = tmp_path / "reader"
        attach(reader, url)

        def all_there() -> bool:
            try:
                return sorted_rows(reader, "select count(*) from spans")[0][0] == sent
            except Exception:
                return False
        wait_until(all_there, 60, "the spans acknowledged while S3 was down never reached the store")
    finally:
        assert stop_process(proc) == 0
    assert sorted_rows(tmp_path / "reader", "select count(distinct span_id) from spans")[0][0] == sent


def test_a_writer_id_belongs_to_one_work_directory(s3, tmp_path):
    url = f"s3://{s3.bucket}/store"
    dump = tmp_path / "one.json"
    dump.write_text(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [{
        "traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": "b7ad6b7169203331", "name": "root",
        "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1700000001000000000"}]}]}]}))
    _in_process("ingest", str(dump), "--data", url, "--work-dir", str(tmp_path / "w1"), "--writer-id", "x")
    second = _run("ingest", str(dump), "--data", url, "--work-dir", str(tmp_path / "w2"), "--writer-id", "x",
                  check=False)
    assert second.returncode != 0
    assert "writer id 'x'" in second.stderr and "Traceback" not in second.stderr, second.stderr
    listing = read_listing(open_remote(url))
    assert list(listing) == ["x"] and len(listing["x"]["spans"]) == 1


def test_compaction_drops_files_from_the_manifest_then_deletes_them(s3, tmp_path, monkeypatch):
    url = f"s3://{s3.bucket}/store"
    work = tmp_path / "w"
    attach(work, url, "w1")
    table = work / "tables" / "traces"
    table.mkdir(parents=True)
    import pyarrow as pa
    import pyarrow.parquet as pq

    for i in range(3):
        pq.write_table(pa.table({"x": [i]}), table / f"part-{i}.parquet")
    first = publish(work, grace_seconds=3600)
    assert first is not None and first.uploaded == 3 and first.generation == 1
    fs = s3.filesystem()
    for i in range(3):
        (table / f"part-{i}.parquet").unlink()  # a local compaction replaced them
    pq.write_table(pa.table({"x": [0, 1, 2]}), table / "merged-0.parquet")
    second = publish(work, grace_seconds=3600)
    assert second is not None and second.uploaded == 1 and second.deleted == 0 and second.generation == 2
    assert sorted(read_listing(open_remote(url))["w1"]["traces"]) == ["w1--merged-0.parquet"]
    assert len(fs.ls(f"{s3.bucket}/store/tables/traces")) == 4  # the old ones stay for readers of generation 1
    third = publish(work, grace_seconds=0)
    assert third is not None and third.deleted == 3 and third.generation is None  # nothing new to list
    assert [p.rpartition("/")[2] for p in fs.ls(f"{s3.bucket}/store/tables/traces")] == ["w1--merged-0.parquet"]
    # the commands a user is told to run name the store, not the work directory
    told = _run("build", "--data", url, "--work-dir", str(tmp_path / "b")).stderr
    assert f"no spans in {url} yet" in told and f"tracedag ingest FILE --data {url}" in told, told


@pytest.mark.parametrize("case", ["no-bucket", "no-store", "down"])
def test_a_store_that_cannot_be_used_is_one_clear_line(s3, tmp_path, case):
    url = {"no-bucket": "s3://nosuchbucket/x", "no-store": f"s3://{s3.bucket}/empty", "down": f"s3://{s3.bucket}/x"}[case]
    if case == "down":
        s3.kill()
    r = _run("query", "step_stats", "--data", url, "--work-dir", str(tmp_path / "w"), check=False)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    expected = {"no-bucket": "does not exist", "no-store": "holds no tracedag store", "down": "did not answer"}[case]
    assert expected in r.stderr, r.stderr


def test_uploaded_spans_files_leave_the_work_directory_and_stay_listed(s3, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tracedag.pipeline.store.manifests import KeepLocal

    url = f"s3://{s3.bucket}/store"
    work = tmp_path / "w"
    attach(work, url, "c1")
    part = work / "tables" / "evaluations" / "recv_hour=1"
    part.mkdir(parents=True)
    pq.write_table(pa.table({"x": [1, 2]}), part / "seg-1.parquet")
    first = publish(work, keep_local=KeepLocal(3600))
    assert first is not None and first.uploaded == 1 and first.evicted == 0 and (part / "seg-1.parquet").exists()
    pq.write_table(pa.table({"x": [3]}), part / "seg-2.parquet")
    second = publish(work, keep_local=KeepLocal(0))  # seg-1 is old enough; seg-2 is not uploaded yet
    assert second is not None and second.evicted == 1 and second.uploaded == 1
    assert not (part / "seg-1.parquet").exists() and (part / "seg-2.parquet").exists()
    listed = read_listing(open_remote(url))["c1"]["evaluations"]
    assert sorted(listed) == ["recv_hour=1/c1--seg-1.parquet", "recv_hour=1/c1--seg-2.parquet"]
    from tracedag.pipeline.store.files import parquet_files

    assert [p.name for p in parquet_files(work, "evaluations")] == ["c1--seg-1.parquet", "seg-2.parquet"]
    third = publish(work, keep_local=KeepLocal(0), grace_seconds=0)
    assert third is not None and third.deleted == 0  # evicted files are never deleted from the store
    assert sorted(read_listing(open_remote(url))["c1"]["evaluations"]) == sorted(listed)


def test_serve_over_an_object_store(s3, tmp_path, monkeypatch):
    """tracedag serve --data s3://…: named queries, the SQL endpoint's worker and /metrics read the store."""
    from tests.serve.serve_support import running_server

    url = f"s3://{s3.bucket}/store"
    dump = agent_runs_dump(tmp_path / "spans.json", 6)
    # the writers' commands run in this process (the server is the process under test)
    _in_process("ingest", str(dump), "--data", url, "--work-dir", str(tmp_path / "c"), "--writer-id", "c")
    _in_process("build", "--idle", "0", "--data", url, "--work-dir", str(tmp_path / "b"))
    monkeypatch.setenv("TRACEDAG_WORK_DIR", str(tmp_path / "serve"))
    with running_server(url) as server, server.client(60) as client:
        stats = client.get("/api/queries/step_stats")
        assert stats.status_code == 200 and sum(r["runs"] for r in stats.json() if r["grain"] == "step") == 18
        count = client.post("/api/sql", json={"sql": "select count(*) as n from dag_nodes"})
        assert count.status_code == 200 and count.json()["rows"] == [{"n": 18}], count.text
        refused = client.post("/api/sql", json={"sql": f"select * from read_parquet('{url}/tables/spans/**/*.parquet')"})
        assert refused.status_code == 400
        before = client.get("/metrics")
        assert before.status_code == 200 and "tracedag_traces_built 6" in before.text
        _in_process("score", "--data", url, "--work-dir", str(tmp_path / "b"))  # another writer publishes scores
        after = client.get("/metrics")
        assert after.status_code == 200 and "tracedag_traces_built 6" in after.text
        scored = client.post("/api/sql", json={"sql": "select count(distinct span_id) as n from step_scores"})
        assert scored.json()["rows"] == [{"n": 18}], scored.text


def test_a_command_whose_upload_fails_says_so_and_keeps_the_files(s3, tmp_path):
    url = f"s3://{s3.bucket}/store"
    dump = tmp_path / "one.json"
    dump.write_text(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [{
        "traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": "b7ad6b7169203331", "name": "root",
        "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1700000001000000000"}]}]}]}))
    work = tmp_path / "w"
    _in_process("ingest", str(dump), "--data", url, "--work-dir", str(work), "--writer-id", "x")
    s3.kill()
    again = _run("ingest", str(dump), "--data", url, "--work-dir", str(work), "--writer-id", "x", check=False)
    assert again.returncode != 0 and "Traceback" not in again.stderr, again.stderr
    s3.start()
    dump.write_text(dump.read_text().replace("b7ad6b7169203331", "b7ad6b7169203332"))
    third = _run("ingest", str(dump), "--data", url, "--work-dir", str(work), "--writer-id", "x", check=False)
    assert third.returncode == 0, third.stderr
    assert len(read_listing(open_remote(url))["x"]["spans"]) == 2


def test_saved_regress_reports_reach_every_machine(s3, tmp_path):
    """A report `tracedag regress` saved on one machine is listed and read by `tracedag serve` on another."""
    from tracedag.pipeline.regress import saved

    url = f"s3://{s3.bucket}/store"
    ci, dashboard = attach(tmp_path / "ci", url, "ci"), attach(tmp_path / "dash", url, "dash")
    path = saved.save_report(ci, json.dumps({"verdict": "regressed", "exit_code": 1, "metrics": [{"status": "fail"}],
                                              "baseline": {"selector": "v=1"}, "candidate": {"selector": "v=2"}}))
    assert saved.list_reports(dashboard) == []
    stats = publish(ci)
    assert stats is not None and not stats.errors
    rows = saved.list_reports(dashboard)
    assert [r["name"] for r in rows] == [path.stem] and rows[0]["verdict"] == "regressed" and rows[0]["fail"] == 1
    assert saved.read_report(attach(tmp_path / "other", url, "other"), path.stem)["exit_code"] == 1
