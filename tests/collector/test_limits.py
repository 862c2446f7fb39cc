"""Size limits, bombs, overload and tokens over HTTP (RELIABILITY.md B15-B20, D34, D36, F49-F52)."""

import gzip
import json
import socket
import threading
import time
import zlib

import pytest
from google.rpc import status_pb2

from tests.collector.collector_support import (
    JSON,
    make_request,
    make_span,
    post,
    rss_bytes,
    spool_files,
    stored,
)
from tracedag.collector import admission as service
from tracedag.pipeline.service import CollectorConfig, start_collector

MiB = 1024 * 1024
L = MiB  # small_collector's body limit


def _body_of_size(size: int) -> bytes:
    """A valid request of exactly ``size`` bytes (padding a string attribute)."""
    pad = size - 200
    while True:
        req = make_request([make_span(0)])
        kv = req.resource_spans[0].scope_spans[0].spans[0].attributes.add()
        kv.key, kv.value.string_value = "pad", "x" * pad
        body = req.SerializeToString()
        if len(body) == size:
            return body
        pad += size - len(body)


def _raw(port: int, head: bytes, body_parts=(), read_timeout: float = 10) -> tuple[bytes, float]:
    """Send a raw request; return the response bytes and seconds until the first response byte."""
    s = socket.create_connection(("127.0.0.1", port))
    started = time.monotonic()
    s.sendall(head)
    for part in body_parts:
        try:
            s.sendall(part)
        except OSError:
            break
    s.settimeout(read_timeout)
    first = s.recv(65536)
    elapsed = time.monotonic() - started
    data = first
    try:
        while b"\r\n\r\n" not in data or len(data) < data.index(b"\r\n\r\n") + 4 + _clen(data):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    s.close()
    return data, elapsed


def _clen(data: bytes) -> int:
    for line in data.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 0


def _status(raw: bytes) -> int:
    return int(raw.split(b" ", 2)[1])


def test_b15_exact_limit_ok_one_more_413(small_collector):
    port = small_collector.http_port
    assert post(port, _body_of_size(L)).status == 200
    r = post(port, _body_of_size(L + 1))
    assert r.status == 413 and status_pb2.Status.FromString(r.body).message
    assert post(port, make_request([make_span(9)]).SerializeToString()).status == 200


def test_b16_lying_content_length(small_collector):
    before = rss_bytes()
    head = (b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
            b"Content-Length: 10737418240\r\n\r\n")
    raw, elapsed = _raw(small_collector.http_port, head, [b"\0" * 1024])
    assert _status(raw) == 413 and elapsed < 2
    assert rss_bytes() - before < 10 * MiB


def test_b17_chunked_overflow(small_collector):
    head = b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunk = b"\x0a" * (64 * 1024)
    parts = [b"%x\r\n" % len(chunk) + chunk + b"\r\n"] * (5 * L // len(chunk))
    before = rss_bytes()
    raw, _ = _raw(small_collector.http_port, head, parts)
    assert _status(raw) == 413
    assert rss_bytes() - before < 2 * L + 8 * MiB
    assert spool_files(small_collector.data) == []


def _bomb(decompressed: int) -> bytes:
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = b"\0" * MiB
    out = [comp.compress(zeros) for _ in range(decompressed // MiB)]
    return b"".join(out) + comp.flush()


def test_b18_gzip_bomb_and_concurrent_bombs(small_collector):
    bomb = _bomb(256 * MiB)
    assert len(bomb) < 400 * 1024
    port = small_collector.http_port
    cpu = time.process_time()
    r = post(port, bomb, headers={"Content-Encoding": "gzip"})
    assert r.status == 413 and time.process_time() - cpu < 1.0
    before = rss_bytes()
    results = []
    threads = [threading.Thread(target=lambda: results.append(post(port, bomb, headers={"Content-Encoding": "gzip"})))
               for _ in range(32)]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    ok = post(port, make_request([make_span(1)]).SerializeToString())
    normal_latency = time.monotonic() - t0
    for t in threads:
        t.join()
    assert {r.status for r in results} <= {413, 503}
    assert ok.status in (200, 503) and normal_latency < 5
    assert rss_bytes() - before < 2 * 32 * L + 64 * MiB


def test_b19_nested_gzip_decompressed_once(small_collector):
    body = make_request([make_span(0)]).SerializeToString()
    r = post(small_collector.http_port, gzip.compress(gzip.compress(body)), headers={"Content-Encoding": "gzip"})
    assert r.status == 400


def test_b20_recursion_bomb_http(small_collector):
    port = small_collector.http_port
    req = make_request([make_span(0)])
    kv = req.resource_spans[0].scope_spans[0].spans[0].attributes.add()
    kv.key = "deep"
    v = kv.value
    for _ in range(10_000):
        v = v.array_value.values.add()
    assert post(port, req.SerializeToString()).status == 400
    deep_json = ('{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"' + "01" * 16 + '","spanId":"' + "02" * 8
                 + '","attributes":[{"key":"k","value":' + '{"arrayValue":{"values":[' * 10_000 + "{}"
                 + "]}}" * 10_000 + "}]}]}]}]}")
    assert post(port, deep_json.encode(), JSON).status == 400
    ok = make_request([make_span(1)])
    kv = ok.resource_spans[0].scope_spans[0].spans[0].attributes.add()
    kv.key = "nested64"
    v = kv.value
    for _ in range(64):
        v = v.kvlist_value.values.add()
        v.key = "k"
        v = v.value
    v.string_value = "leaf"
    assert post(port, ok.SerializeToString()).status == 200


def test_d34_d36_inflight_overload_503_retry_after(small_collector):
    port = small_collector.http_port
    head = (b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
            b"Content-Length: %d\r\n\r\n" % L)
    holders = []
    for _ in range(4):  # 4 x (1 MiB - 1) in flight: the 4 MiB budget is used up
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(head + b"\0" * (L - 1))
        holders.append(s)
    time.sleep(0.5)
    r = post(port, make_request([make_span(i) for i in range(3000)]).SerializeToString())
    for s in holders:
        s.close()
    assert r.status == 503
    assert r.headers["retry-after"] == "1"
    assert "overload" in status_pb2.Status.FromString(r.body).message
    small_collector.flush()
    assert stored(small_collector.data) == []


def test_d34_backlog_full_503_and_not_ready(tmp_path):
    c = start_collector(CollectorConfig(data=tmp_path, http_port=0, grpc_port=0, convert=False, max_backlog_bytes=1))
    try:
        assert post(c.http_port, make_request([make_span(0)]).SerializeToString()).status == 200
        c.flush()
        time.sleep(0.3)
        r = post(c.http_port, b"{}", JSON)
        assert r.status == 503 and r.headers["retry-after"] == "1" and "backlog" in json.loads(r.body)["message"]
        ready = post(c.http_port, b"", None, "/readyz", "GET")
        assert ready.status == 503 and b"backlog" in ready.body
    finally:
        c.stop(1)


@pytest.fixture
def token_collector(tmp_path):
    token_file = tmp_path / "tokens"
    token_file.write_text("file-token-1\n")
    c = start_collector(CollectorConfig(data=tmp_path / "d", http_port=0, grpc_port=0,
                                        tokens=("static-secret-token",), token_file=token_file))
    yield c, token_file
    c.stop(1)


def test_f49_missing_or_wrong_token_401_never_echoed(token_collector, caplog):
    c, _ = token_collector
    body = make_request([make_span(0)]).SerializeToString()
    for hdrs in ({}, {"Authorization": "Bearer wrong-token-value-XYZ"}, {"Authorization": "Basic static-secret-token"}):
        r = post(c.http_port, body, headers=hdrs)
        assert r.status == 401 and status_pb2.Status.FromString(r.body).message
        assert b"wrong-token-value-XYZ" not in r.body
    assert "wrong-token-value-XYZ" not in caplog.text
    assert spool_files(c.data) == []
    for tok in ("static-secret-token", "file-token-1"):
        assert post(c.http_port, body, headers={"Authorization": f"Bearer {tok}"}).status == 200


def test_f50_auth_before_body(token_collector):
    c, _ = token_collector
    before = service.BYTES_RECEIVED.value(stage="wire")
    head = (b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
            b"Content-Encoding: gzip\r\nAuthorization: Bearer nope\r\nContent-Length: 1073741824\r\n\r\n")
    raw, elapsed = _raw(c.http_port, head, [_bomb(8 * MiB)[:64 * 1024]])
    assert _status(raw) == 401 and elapsed < 0.5
    assert service.BYTES_RECEIVED.value(stage="wire") == before


def test_f51_constant_time_comparison(monkeypatch):
    calls = []
    real = service.hmac.compare_digest

    def spy(a, b):
        calls.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(service.hmac, "compare_digest", spy)
    tokens = service.Tokens(["a-rather-long-token", "short"])
    assert not tokens.check("Bearer x")
    assert tokens.check("Bearer short")
    assert (1, 19) in calls and (1, 5) in calls  # unequal lengths go through compare_digest too


def test_f52_token_file_rotation(token_collector):
    c, token_file = token_collector
    body = make_request([make_span(0)]).SerializeToString()
    assert post(c.http_port, body, headers={"Authorization": "Bearer file-token-1"}).status == 200
    token_file.write_text("# rotated\nfile-token-2\n")
    deadline = time.time() + 5
    while post(c.http_port, body, headers={"Authorization": "Bearer file-token-1"}).status != 401:
        assert time.time() < deadline
        time.sleep(0.2)
    assert post(c.http_port, body, headers={"Authorization": "Bearer file-token-2"}).status == 200
    assert post(c.http_port, body, headers={"Authorization": "Bearer static-secret-token"}).status == 200


def test_slow_headers_closed_by_timeout(tmp_path):
    c = start_collector(CollectorConfig(data=tmp_path, http_port=0, grpc_port=None, header_timeout=0.5,
                                        body_timeout=0.5))
    try:
        s = socket.create_connection(("127.0.0.1", c.http_port))
        s.sendall(b"POST /v1/traces HTTP/1.1\r\n")
        s.settimeout(5)
        t0 = time.monotonic()
        assert s.recv(100) == b""  # closed without an answer
        assert time.monotonic() - t0 < 3
        s.close()
        head = (b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
                b"Content-Length: 1000\r\n\r\n")
        raw, _ = _raw(c.http_port, head, [b"\0" * 10])
        assert _status(raw) == 408
        assert spool_files(c.data) == []
    finally:
        c.stop(1)
