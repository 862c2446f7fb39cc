"""Crash safety of the real collector process (RELIABILITY.md E37, E38 a/b) and graceful SIGTERM (E42).

Invariant: every span whose export returned SUCCESS is stored exactly once after a restart
("stored" = visible in ``tracedag.pipeline.store.views.connect(data)`` after conversion).

E37 drives the four client flavours of the test plan at once, each a real exporter in its own
process: HTTP/protobuf and gRPC from this project's SDK (1.45.2), the HTTP exporter of SDK 1.44.0
(which gzips inside each attempt and retries differently), and the OTLP/HTTP JSON exporter
(``opentelemetry-exporter-otlp-json-http``). The last two cannot be installed beside SDK 1.45.2,
so they run from cached pinned venvs (``pinned_venv``; the lock files sit beside this test).
"""

import http.client
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.collector.collector_support import PB, make_request, make_span, post, start_process, stop_process
from tests.pinned_venv import PinnedVenv, client_env
from tracedag.pipeline.service import CollectorConfig, start_collector
from tracedag.pipeline.store.views import connect

HERE = Path(__file__).resolve().parent
SDK_1_44 = PinnedVenv("otel-sdk-venv", HERE / "otel_sdk_1_44_requirements.txt", "opentelemetry-exporter-otlp-proto-http",
                      "import opentelemetry.exporter.otlp.proto.http.trace_exporter")
JSON_HTTP = PinnedVenv("otel-json-venv", HERE / "otel_json_requirements.txt", "opentelemetry-exporter-otlp-json-http",
                       "import opentelemetry.exporter.otlp.json.http.trace_exporter")
PINNED_VENVS = [SDK_1_44, JSON_HTTP]  # built in the background from the start of the run (tests.pinned_venv)


def _flavours() -> list[tuple[str, str, str]]:
    """(name, python, transport) of each client flavour; the pinned venvs are built on first use."""
    return [("http-1.45", sys.executable, "http"), ("grpc-1.45", sys.executable, "grpc"),
            ("http-1.44", str(SDK_1_44.ensure()), "http"), ("json", str(JSON_HTTP.ensure()), "json")]


def _final_check(data: Path, acked: set[str]) -> set[str]:
    """Restart on ``data``, convert everything, and check the exactly-once invariant; return stored ids."""
    c = start_collector(CollectorConfig(data=data, http_port=None, grpc_port=None))
    try:
        c.flush()
    finally:
        c.stop(1)
    con = connect(data)
    dups = con.sql("select trace_id, span_id, count(*) from spans group by all having count(*) > 1").fetchall()
    assert dups == []
    ids = {f"{t}:{s}" for t, s in con.sql("select trace_id, span_id from spans").fetchall()}
    missing = acked - ids
    assert not missing, f"{len(missing)} acknowledged spans lost"
    assert not list((data / "tables").rglob("*.tmp")) if (data / "tables").exists() else True
    return ids


def _acked(files: list[Path]) -> set[str]:
    out: set[str] = set()
    for f in files:
        if f.exists():
            out |= {line for line in f.read_text().splitlines() if len(line) == 49}
    return out


def _wait_for_acks(files: list[Path], timeout: float) -> None:
    deadline = time.time() + timeout
    while not all(f.exists() and f.stat().st_size for f in files):
        assert time.time() < deadline, "load clients got no SUCCESS"
        time.sleep(0.1)


def _kill_rounds(tmp_path: Path, rounds: int, seed: int) -> None:
    rng = random.Random(seed)
    data = tmp_path / "data"
    flavours = _flavours()
    outs: dict[str, list[Path]] = {name: [] for name, _, _ in flavours}
    for r in range(rounds):
        proc, http_port, grpc_port = start_process(data)
        endpoints = {"http": f"http://127.0.0.1:{http_port}/v1/traces", "json": f"http://127.0.0.1:{http_port}/v1/traces",
                     "grpc": f"127.0.0.1:{grpc_port}"}
        clients = []
        for name, python, transport in flavours:
            out = tmp_path / f"acked-{r}-{name}.txt"
            outs[name].append(out)
            clients.append(subprocess.Popen(
                [python, str(HERE / "load_client.py"), transport, endpoints[transport], str(out), "60"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=client_env(),
            ))
        _wait_for_acks([files[-1] for files in outs.values()], 60)
        time.sleep(rng.uniform(0.3, 2.0))
        proc.kill()  # SIGKILL under load
        proc.wait(10)
        time.sleep(1.0)  # clients see the failure, then stop (a SUCCESS not yet logged only shrinks `acked`)
        for client in clients:
            client.terminate()
            client.wait(30)
    acked = {name: _acked(files) for name, files in outs.items()}
    assert all(acked.values()), {name: len(ids) for name, ids in acked.items()}  # every flavour got SUCCESS
    _final_check(data, set().union(*acked.values()))


def test_e37_sigkill_under_load_one_round(tmp_path):
    _kill_rounds(tmp_path, rounds=2, seed=1)


@pytest.mark.slow
def test_e37_sigkill_under_load_many_rounds(tmp_path):
    _kill_rounds(tmp_path, rounds=10, seed=7)


def _send(port: int, body: bytes) -> int | None:
    """POST and return the status, or None when the connection died without an answer."""
    try:
        return post(port, body).status
    except (http.client.RemoteDisconnected, ConnectionError):
        return None


@pytest.mark.parametrize(("point", "must_store_crashed"), [
    ("after_write_before_fsync", False), ("after_fsync_before_ack", True)])
def test_e38_crash_points(tmp_path, point, must_store_crashed):
    data = tmp_path / "data"
    proc, port, _ = start_process(data, env={"TRACEDAG_FAULT": point, "TRACEDAG_FAULT_SKIP": "2"})
    acked = set()
    statuses = []
    for i in range(3):
        req = make_request([make_span(100 * i + j) for j in range(5)])
        status = _send(port, req.SerializeToString())
        statuses.append(status)
        if status == 200:
            acked |= {f"{s.trace_id.hex()}:{s.span_id.hex()}" for s in req.resource_spans[0].scope_spans[0].spans}
    assert proc.wait(10) == 137
    assert statuses == [200, 200, None]
    ids = _final_check(data, acked)
    crashed = {f"{(201 + j).to_bytes(16, 'big').hex()}:{(201 + j).to_bytes(8, 'big').hex()}" for j in range(5)}
    if must_store_crashed:
        assert crashed <= ids  # fsynced before the crash: kept (the client may resend; dedupe holds)
    else:
        assert len(ids) in (10, 15)


def test_e42_sigterm_drains_and_flushes(tmp_path):
    data = tmp_path / "data"
    proc, port, _ = start_process(data)
    body = make_request([make_span(i) for i in range(50)]).SerializeToString()
    assert post(port, body, PB).status == 200
    started = time.monotonic()
    assert stop_process(proc, signal.SIGTERM) == 0
    assert time.monotonic() - started < 15
    assert connect(data).sql("select count(*) from spans").fetchall() == [(50,)]
    assert not list((data / "spool").glob("*.open"))


@pytest.mark.parametrize("retention", ["0", "24"])
def test_spool_retention_option_deletes_or_keeps_converted_segments(tmp_path, retention):
    data = tmp_path / "data"
    proc, port, _ = start_process(data, "--spool-retention", retention)
    assert post(port, make_request([make_span(i) for i in range(20)]).SerializeToString(), PB).status == 200
    assert stop_process(proc, signal.SIGTERM) == 0
    assert connect(data).sql("select count(*) from spans").fetchall() == [(20,)]
    kept = list((data / "spool").rglob("seg-*"))
    assert [p.parent.name for p in kept] == ([] if retention == "0" else ["done"])
