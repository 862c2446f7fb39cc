"""Fixtures for the collector tests: a real collector on loopback (port 0) and raw HTTP helpers."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from tracedag.pipeline.service import CollectorConfig, RunningCollector, start_collector
from tracedag.pipeline.store.views import connect

HERE = Path(__file__).resolve().parent
EXAMPLE_JSON = (HERE / "trace_example.json").read_bytes()
PB = "application/x-protobuf"
JSON = "application/json"


@dataclass
class Resp:
    status: int
    headers: dict[str, str]
    body: bytes


def post(port: int, body: bytes, content_type: str | None = PB, path: str = "/v1/traces",
         method: str = "POST", headers: dict[str, str] | None = None, timeout: float = 30) -> Resp:
    """One request on a fresh connection; returns status, lower-cased headers and body."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    hdrs = dict(headers or {})
    if content_type is not None:
        hdrs["Content-Type"] = content_type
    conn.request(method, path, body=body, headers=hdrs)
    r = conn.getresponse()
    out = Resp(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    conn.close()
    return out


def make_span(i: int, trace: bytes | None = None, **fields) -> Span:
    span = Span(
        trace_id=trace or (i + 1).to_bytes(16, "big"),
        span_id=(i + 1).to_bytes(8, "big"),
        name=f"span-{i}",
        start_time_unix_nano=1_700_000_000_000_000_000 + i,
        end_time_unix_nano=1_700_000_000_000_000_000 + i + 1000,
    )
    for key, value in fields.items():
        setattr(span, key, value)
    return span


def make_request(spans: list[Span], service: str = "svc") -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    kv = rs.resource.attributes.add()
    kv.key, kv.value.string_value = "service.name", service
    rs.scope_spans.add().spans.extend(spans)
    return req


def stored(data: Path, where: str = "true") -> list[tuple]:
    """(trace_id, span_id, name) rows visible through the spans view (no shared query macro: ~28 ms less CPU a call,
    and waits for the collector call it again and again)."""
    con = connect(data, shared_macros=False)
    return con.sql(f"select trace_id, span_id, name from spans where {where} order by trace_id, span_id").fetchall()


def spool_files(data: Path) -> list[Path]:
    spool = data / "spool"
    return sorted(p for p in spool.rglob("seg-*")) if spool.exists() else []


@pytest.fixture
def collector(tmp_path) -> Iterator[RunningCollector]:
    c = start_collector(CollectorConfig(data=tmp_path / "data", http_port=0, grpc_port=0))
    yield c
    c.stop(2)


@pytest.fixture
def small_collector(tmp_path) -> Iterator[RunningCollector]:
    """A collector with a 1 MiB body limit and a 4 MiB in-flight budget (limits tests)."""
    c = start_collector(CollectorConfig(
        data=tmp_path / "data", http_port=0, grpc_port=0, max_body_bytes=1024 * 1024,
        max_inflight_bytes=4 * 1024 * 1024,
    ))
    yield c
    c.stop(2)


def rss_bytes(pid: int | str = "self") -> int:
    """Resident memory of a process (``/proc/<pid>/status`` VmRSS); 0 once it has ended."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            return next((int(line.split()[1]) * 1024 for line in fh if line.startswith("VmRSS:")), 0)
    except OSError:
        return 0


def wait_until(condition, seconds: float = 30.0, message: str = "timed out") -> None:
    """Poll ``condition`` every 50 ms, or twice as long as it took when that is longer; fail with ``message``
    after ``seconds``. A condition that queries the store (root causes: a connection and a named query, ~0.1 s
    of CPU) polled back to back took a third to half of a core from the collector whose work it waited for."""
    deadline = time.monotonic() + seconds
    while True:
        started = time.monotonic()
        if condition():
            return
        assert time.monotonic() < deadline, message
        time.sleep(max(0.05, 2 * (time.monotonic() - started)))


def start_process(data: Path, *args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, int, int]:
    """Run ``tracedag collect`` as a separate process; return it with its HTTP and gRPC ports."""
    cmd = [sys.executable, "-c", "from tracedag.pipeline.cli import cli; cli()", "collect", "--http-port", "0", "--grpc-port", "0",
           "--data", str(data), *args]
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env)
    assert proc.stdout is not None
    deadline = time.time() + 30
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        m = re.search(r"http_port=(\d+) grpc_port=(\d+)", line)
        if m:
            return proc, int(m.group(1)), int(m.group(2))
    proc.kill()
    raise AssertionError(f"collector did not start: {proc.stderr.read() if proc.stderr else ''}")


def stop_process(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
    proc.send_signal(sig)
    return proc.wait(timeout)


def json_doc(spans: list[dict]) -> bytes:
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}).encode()


@dataclass
class Issued:
    """A certificate and its key, as PEM files."""

    cert: Path
    key: Path
    name: str


def make_ca(folder: Path, name: str) -> tuple[Issued, object, object]:
    """A self-signed CA (written to ``folder``); returns it with its cryptography cert and key objects."""
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, name)])
    builder = _cert_builder(subject, subject, key.public_key()).add_extension(
        x509.BasicConstraints(ca=True, path_length=None), critical=True)
    cert = _sign(builder, key)
    return _write_pem(folder, name, cert, key), cert, key


def issue_cert(folder: Path, name: str, ca: tuple[Issued, object, object], server: bool) -> Issued:
    """A server (SAN 127.0.0.1/localhost) or client certificate signed by ``ca``."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec

    _, ca_cert, ca_key = ca
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, name)])
    usage = x509.oid.ExtendedKeyUsageOID.SERVER_AUTH if server else x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH
    builder = _cert_builder(subject, ca_cert.subject, key.public_key()).add_extension(
        x509.ExtendedKeyUsage([usage]), critical=False)
    if server:
        san = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    return _write_pem(folder, name, _sign(builder, ca_key), key)


def _cert_builder(subject, issuer, public_key):
    import datetime

    from cryptography import x509

    now = datetime.datetime.now(datetime.UTC)
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public_key)
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1)))


def _sign(builder, key):
    from cryptography.hazmat.primitives import hashes

    return builder.sign(key, hashes.SHA256())


def _write_pem(folder: Path, name: str, cert, key) -> Issued:
    from cryptography.hazmat.primitives import serialization

    folder.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = folder / f"{name}.crt", folder / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return Issued(cert_path, key_path, name)
