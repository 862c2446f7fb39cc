"""Requests the decoder cannot take as text, bodies without framing, and bugs in a receiver:
each gets an answer (400, 411, 500/INTERNAL with a logged id), never a dropped connection."""

from __future__ import annotations

import json
import re
import socket

import grpc
import pytest

from tests.collector.collector_support import (
    JSON,
    PB,
    make_request,
    make_span,
    post,
    spool_files,
    start_process,
    stop_process,
)
from tracedag.collector.admission import INTERNAL_ERRORS

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
TRACE = "0102030405060708090a0b0c0d0e0f10"


def _doc(name: str = "ok", key: str = "k", value: str = "v") -> bytes:
    span = {"traceId": TRACE, "spanId": "0102030405060708", "name": name,
            "attributes": [{"key": key, "value": {"stringValue": value}}]}
    text = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]})
    return text.replace("SURROGATE", "\\ud800").encode()


@pytest.mark.parametrize("where", ["name", "key", "value"])
def test_lone_surrogate_in_json_is_400_naming_the_field(collector, where):
    body = _doc(**{where: "aSURROGATEb"})
    r = post(collector.http_port, body, JSON)
    assert r.status == 400, r.body
    message = json.loads(r.body)["message"]
    assert "surrogate" in message and "\\ud800" in message
    assert {"name": "spans[0].name", "key": "attributes[0].key", "value": "stringValue"}[where] in message
    assert post(collector.http_port, _doc(), JSON).status == 200  # the connection and collector carry on
    collector.flush()
    assert [p for p in spool_files(collector.data) if p.stat().st_size] != []


def _raw(port: int, request: bytes, wait: float = 10) -> bytes:
    """The answer to ``request`` sent on a connection of its own: read until the connection closes or one whole
    response (its head and Content-Length bytes) is in (a server that closes lingers up to 5 s for the rest of a
    refused body, which a client that has its answer does not wait for)."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as s:
        s.sendall(request)
        out = b""
        while not _whole_response(out):
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            out += chunk
    return out


def _whole_response(out: bytes) -> bool:
    head, sep, body = out.partition(b"\r\n\r\n")
    length = re.search(rb"(?im)^content-length:\s*(\d+)\s*$", head)
    return bool(sep and length and len(body) >= int(length.group(1)))


@pytest.mark.parametrize("version", ["HTTP/1.0", "HTTP/1.1"])
def test_post_without_content_length_is_411_and_nothing_stored(collector, version):
    body = make_request([make_span(0)]).SerializeToString()
    head = f"POST /v1/traces {version}\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n\r\n".encode()
    answer = _raw(collector.http_port, head + body)
    assert answer.startswith(b"HTTP/1.1 411 Length Required"), answer[:200]
    assert b"Connection: close" in answer
    collector.flush()
    assert spool_files(collector.data) == []


def test_content_length_zero_is_still_an_empty_request(collector):
    head = b"POST /v1/traces HTTP/1.0\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n"
    assert _raw(collector.http_port, head).startswith(b"HTTP/1.1 200")


def test_unexpected_exception_is_a_counted_500_with_a_logged_id(tmp_path):
    proc, http_port, grpc_port = start_process(tmp_path / "data", env={"TRACEDAG_FAULT_RAISE": "export"})
    try:
        body = make_request([make_span(0)]).SerializeToString()
        r = post(http_port, body, PB)
        assert r.status == 500
        from google.rpc import status_pb2

        message = status_pb2.Status.FromString(r.body).message
        http_id = re.search(r"internal error ([0-9a-f]{12})", message).group(1)
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as ch, pytest.raises(grpc.RpcError) as err:
            ch.unary_unary(EXPORT)(body, timeout=10)
        assert err.value.code() == grpc.StatusCode.INTERNAL
        grpc_id = re.search(r"internal error ([0-9a-f]{12})", err.value.details()).group(1)
        metrics = post(http_port, b"", None, path="/metrics", method="GET").body.decode()
        assert f'{INTERNAL_ERRORS.name}{{transport="http"}} 1' in metrics
        assert f'{INTERNAL_ERRORS.name}{{transport="grpc"}} 1' in metrics
        assert 'tracedag_requests_total{transport="http",status="500"} 1' in metrics
    finally:
        stop_process(proc)
    log = proc.stderr.read()
    assert http_id in log and grpc_id in log and "InjectedFault" in log
