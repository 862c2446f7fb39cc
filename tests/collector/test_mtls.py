"""F54 TLS: mutual TLS on both transports with the real exporters, certificate reload without a
restart, and TLS 1.0/1.1 refused (checked against a control server that does accept them).

Certificates are made in the test with the ``cryptography`` package.
"""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import threading
import time
import warnings

import grpc
import pytest
from cryptography import x509
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.trace.export import SpanExportResult

from tests.collector.collector_support import issue_cert, make_ca
from tests.collector.test_exporters import _finished_spans, _ids, _stored_ids
from tracedag.pipeline.service import CollectorConfig, start_collector


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA with two server certificates and a client certificate, plus a client from another CA."""
    d = tmp_path_factory.mktemp("pki")
    ca = make_ca(d, "test-ca")
    rogue_ca = make_ca(d, "rogue-ca")
    return {
        "ca": ca[0],
        "server_a": issue_cert(d, "server-a", ca, server=True),
        "server_b": issue_cert(d, "server-b", ca, server=True),
        "client": issue_cert(d, "client", ca, server=False),
        "rogue": issue_cert(d, "rogue-client", rogue_ca, server=False),
    }


@pytest.fixture
def mtls(tmp_path, pki, monkeypatch):
    """A collector serving copies of server-a's files (so a test can replace them), clients from the CA only."""
    for var in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE"):
        monkeypatch.delenv(var, raising=False)
    cert, key = tmp_path / "server.crt", tmp_path / "server.key"
    shutil.copy(pki["server_a"].cert, cert)
    shutil.copy(pki["server_a"].key, key)
    c = start_collector(CollectorConfig(data=tmp_path / "data", http_port=0, grpc_port=0, tls_cert=cert,
                                        tls_key=key, tls_client_ca=pki["ca"].cert))
    yield c, cert, key
    c.stop(1)


def _http_export(port: int, pki, client, spans) -> SpanExportResult:
    exp = HttpExporter(endpoint=f"https://127.0.0.1:{port}/v1/traces", certificate_file=str(pki["ca"].cert),
                       client_certificate_file=str(client.cert) if client else None,
                       client_key_file=str(client.key) if client else None, timeout=2)
    return exp.export(spans)


def _grpc_export(port: int, pki, client, spans) -> SpanExportResult:
    ca = pki["ca"].cert.read_bytes()
    if client is None:
        creds = grpc.ssl_channel_credentials(ca)
    else:
        creds = grpc.ssl_channel_credentials(ca, client.key.read_bytes(), client.cert.read_bytes())
    return GrpcExporter(endpoint=f"127.0.0.1:{port}", credentials=creds, timeout=2).export(spans)


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_f54_mtls_client_certificate_required(mtls, pki, transport):
    c, _, _ = mtls
    port, export = (c.http_port, _http_export) if transport == "http" else (c.grpc_port, _grpc_export)
    anonymous, rogue, good = (_finished_spans(2, f"{transport}-{n}") for n in ("anon", "rogue", "good"))
    assert export(port, pki, None, anonymous) == SpanExportResult.FAILURE
    assert export(port, pki, pki["rogue"], rogue) == SpanExportResult.FAILURE
    assert export(port, pki, pki["client"], good) == SpanExportResult.SUCCESS
    c.flush()
    assert _stored_ids(c.data) == _ids(good)


def _served_name(port: int, pki, alpn: bool) -> str:
    """The common name of the certificate the server presents to a new (client-authenticated) connection."""
    ctx = ssl.create_default_context(cafile=str(pki["ca"].cert))
    ctx.load_cert_chain(str(pki["client"].cert), str(pki["client"].key))
    if alpn:
        ctx.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            ctx.wrap_socket(raw, server_hostname="localhost") as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    cert = x509.load_der_x509_certificate(der)
    return str(cert.subject.get_attributes_for_oid(x509.oid.NameOID.COMMON_NAME)[0].value)


def _replace(src, dst) -> None:
    tmp = dst.with_name(dst.name + ".new")
    shutil.copy(src, tmp)
    os.replace(tmp, dst)


def test_f54_certificate_reload_without_restart(mtls, pki):
    c, cert, key = mtls
    assert _served_name(c.http_port, pki, alpn=False) == "server-a"
    assert _served_name(c.grpc_port, pki, alpn=True) == "server-a"
    _replace(pki["server_b"].cert, cert)
    _replace(pki["server_b"].key, key)
    deadline = time.monotonic() + 6
    served = ("", "")
    while served != ("server-b", "server-b"):
        assert time.monotonic() < deadline, f"still serving {served} 6 s after the files changed"
        time.sleep(0.3)
        served = (_served_name(c.http_port, pki, alpn=False), _served_name(c.grpc_port, pki, alpn=True))
    for transport, port, export in (("http", c.http_port, _http_export), ("grpc", c.grpc_port, _grpc_export)):
        assert export(port, pki, pki["client"], _finished_spans(1, f"after-{transport}")) == SpanExportResult.SUCCESS


def _old_tls_client(version: ssl.TLSVersion, pki) -> ssl.SSLContext:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ctx.maximum_version = version
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    ctx.set_ciphers("DEFAULT:@SECLEVEL=0")
    ctx.load_cert_chain(str(pki["client"].cert), str(pki["client"].key))
    return ctx


def _handshake(port: int, ctx: ssl.SSLContext) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, ctx.wrap_socket(raw) as tls:
        return str(tls.version())


def _control_server(pki) -> int:
    """A plain Python TLS server that accepts TLS 1.0 and 1.1 (proves the client can speak them)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1
    ctx.set_ciphers("DEFAULT:@SECLEVEL=0")
    ctx.load_cert_chain(str(pki["server_a"].cert), str(pki["server_a"].key))
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        for _ in range(1):
            conn, _ = listener.accept()
            try:
                with ctx.wrap_socket(conn, server_side=True):
                    pass
            except OSError:
                continue
        listener.close()

    threading.Thread(target=serve, daemon=True).start()
    return int(listener.getsockname()[1])


@pytest.mark.parametrize("version", ["TLSv1", "TLSv1_1"])
def test_f54_tls_1_0_and_1_1_refused_on_both_ports(mtls, pki, version):
    c, _, _ = mtls
    tls_version = getattr(ssl.TLSVersion, version)
    control = _control_server(pki)
    assert _handshake(control, _old_tls_client(tls_version, pki)) in ("TLSv1", "TLSv1.1")
    for port in (c.http_port, c.grpc_port):
        with pytest.raises((ssl.SSLError, ConnectionError)):
            _handshake(port, _old_tls_client(tls_version, pki))
