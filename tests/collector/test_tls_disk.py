"""TLS on both transports, disk failure (E45/E46 by fault injection), and HTTP fuzzing of the live server."""

import errno
import http.client
import json
import os
import socket
import ssl
import subprocess
import time

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.trace.export import SpanExportResult

from tests.collector.collector_support import JSON, PB, make_request, make_span, post, stored
from tests.collector.test_exporters import _finished_spans, _ids, _stored_ids
from tests.fuzzing import examples
from tracedag.collector import spool as spool_mod
from tracedag.pipeline.service import CollectorConfig, start_collector


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(d / "key.pem"), "-out",
         str(d / "cert.pem"), "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, capture_output=True,
    )
    return d / "cert.pem", d / "key.pem"


def test_f54_tls_on_http_and_grpc(tmp_path, cert, monkeypatch):
    for var in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):  # requests lets these override the exporter's CA file
        monkeypatch.delenv(var, raising=False)
    cert_file, key_file = cert
    c = start_collector(CollectorConfig(data=tmp_path, http_port=0, grpc_port=0, tls_cert=cert_file, tls_key=key_file))
    try:
        spans_http, spans_grpc = _finished_spans(3, "tls-http"), _finished_spans(3, "tls-grpc")
        exp = HttpExporter(endpoint=f"https://127.0.0.1:{c.http_port}/v1/traces", certificate_file=str(cert_file))
        assert exp.export(spans_http) == SpanExportResult.SUCCESS
        creds = grpc.ssl_channel_credentials(cert_file.read_bytes())
        gexp = GrpcExporter(endpoint=f"127.0.0.1:{c.grpc_port}", credentials=creds)
        assert gexp.export(spans_grpc) == SpanExportResult.SUCCESS
        old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        old.check_hostname, old.verify_mode = False, ssl.CERT_NONE
        old.minimum_version = old.maximum_version = ssl.TLSVersion.TLSv1_1
        with pytest.raises((ssl.SSLError, ConnectionError)), socket.create_connection(("127.0.0.1", c.http_port)) as s:
            old.wrap_socket(s).do_handshake()
        with pytest.raises((http.client.HTTPException, ConnectionError, OSError)):
            post(c.http_port, make_request([make_span(0)]).SerializeToString(), timeout=5)  # plaintext to TLS
        c.flush()
        assert _stored_ids(c.data) == _ids(spans_http) | _ids(spans_grpc)
    finally:
        c.stop(1)


@pytest.mark.parametrize(("code", "reason"), [
    (errno.ENOSPC, b"disk full"),  # E45
    (errno.EIO, b"spool I/O error (EIO"),  # E46: a failing disk
    (errno.EROFS, b"spool I/O error (EROFS"),  # E46: remounted read-only
])
def test_e45_e46_disk_fault_503_not_ready_then_resumes(tmp_path, monkeypatch, code, reason):
    c = start_collector(CollectorConfig(data=tmp_path, http_port=0, grpc_port=0))
    real = spool_mod.os.fdatasync
    full = {"on": False}

    def fdatasync(fd):
        if full["on"]:
            raise OSError(code, os.strerror(code))
        real(fd)

    monkeypatch.setattr(spool_mod.os, "fdatasync", fdatasync)
    real_probe = spool_mod.SpoolWriter._probe

    def probe(self):
        if not full["on"]:
            real_probe(self)

    monkeypatch.setattr(spool_mod.SpoolWriter, "_probe", probe)
    try:
        assert post(c.http_port, make_request([make_span(0)]).SerializeToString()).status == 200
        full["on"] = True
        r = post(c.http_port, make_request([make_span(1)]).SerializeToString())
        assert r.status == 503 and r.headers["retry-after"] == "1"
        ready = post(c.http_port, b"", None, "/readyz", "GET")
        assert ready.status == 503 and reason in ready.body
        r2 = post(c.http_port, make_request([make_span(2)]).SerializeToString(), PB)
        assert r2.status == 503
        with pytest.raises(grpc.RpcError) as err, grpc.insecure_channel(f"127.0.0.1:{c.grpc_port}") as ch:
            ch.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")(
                make_request([make_span(3)]).SerializeToString(), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        full["on"] = False
        deadline = time.time() + 5
        while post(c.http_port, b"", None, "/readyz", "GET").status != 200:
            assert time.time() < deadline, "not ready again within 5 s"
            time.sleep(0.1)
        assert post(c.http_port, make_request([make_span(4)]).SerializeToString()).status == 200
        c.flush()
        names = {row[2] for row in stored(c.data)}
        assert {"span-0", "span-4"} <= names and "span-1" not in names
    finally:
        c.stop(1)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    c = start_collector(CollectorConfig(data=tmp_path_factory.mktemp("fuzz"), http_port=0, grpc_port=None,
                                        max_body_bytes=64 * 1024))
    yield c
    c.stop(1)


@settings(max_examples=examples(150), deadline=3000, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(body=st.binary(max_size=4096), ctype=st.sampled_from([PB, JSON, "application/json; charset=utf-8"]),
       gz=st.booleans())
def test_c24_fuzz_http_never_5xx_never_hangs(live, body, ctype, gz):
    headers = {"Content-Encoding": "gzip"} if gz else {}
    started = time.monotonic()
    r = post(live.http_port, body, ctype, headers=headers, timeout=5)
    assert r.status in (200, 400, 413, 415)
    assert time.monotonic() - started < 2
    if r.status == 400 and ctype.startswith(JSON):
        assert json.loads(r.body)["message"]
