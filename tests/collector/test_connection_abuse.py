"""G55-G57 connection abuse on OTLP/HTTP: slow headers, slow body, idle keep-alive, connection cap.

Timeouts are configured in seconds (``header_timeout``, ``body_timeout``, ``idle_timeout``) so the
attacks run for a few seconds; the rules are the same as with the defaults (10 s, 30 s, 60 s).
"""

from __future__ import annotations

import http.client
import select
import socket
import threading
import time

import pytest

from tests.collector.collector_support import PB, make_request, make_span, post, spool_files
from tracedag.collector.admission import REFUSED
from tracedag.pipeline.service import CollectorConfig, start_collector

HEAD = b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"


@pytest.fixture
def strict(tmp_path):
    """A collector with 2 s header/body timeouts, a 2 s idle timeout and at most 300 connections."""
    c = start_collector(CollectorConfig(
        data=tmp_path / "data", http_port=0, grpc_port=None, header_timeout=2.0, body_timeout=2.0,
        idle_timeout=2.0, max_connections=300,
    ))
    yield c
    c.stop(1)


def _closed_by_peer(sock: socket.socket) -> bool:
    """True when the peer closed (or reset) the connection; data it sent is read and dropped."""
    try:
        return sock.recv(65536) == b""
    except ConnectionError:
        return True


def _export_latencies(port: int, count: int) -> list[float]:
    out = []
    for i in range(count):
        started = time.monotonic()
        assert post(port, make_request([make_span(900 + i)]).SerializeToString(), PB, timeout=10).status == 200
        out.append(time.monotonic() - started)
        time.sleep(0.1)
    return out


def _slowloris(port: int, conns: int, seconds: float) -> dict[int, float]:
    """Open ``conns`` connections sending one header byte per second; return when each was closed."""
    socks, opened = [], []
    for _ in range(conns):
        opened.append(time.monotonic())  # before the connect: a stall after it must not shorten the measure
        socks.append(socket.create_connection(("127.0.0.1", port)))
    started = time.monotonic()
    closed: dict[int, float] = {}  # seconds from each connection's open to its close
    pos = 0
    while len(closed) < conns and time.monotonic() - started < seconds:
        for i, s in enumerate(socks):
            if i not in closed:
                try:
                    s.send(HEAD[pos : pos + 1])  # the head, one byte per second
                except OSError:
                    closed[i] = time.monotonic() - opened[i]
        pos += 1
        readable, _, _ = select.select([s for i, s in enumerate(socks) if i not in closed], [], [], 1.0)
        for s in readable:
            if _closed_by_peer(s):
                i = socks.index(s)
                closed[i] = time.monotonic() - opened[i]
    for s in socks:
        s.close()
    return closed


def test_g55_slow_headers_closed_by_header_timeout_while_exports_stay_fast(strict):
    conns = 200  # under the cap of 300, so only the header timeout can close them
    result: dict[int, float] = {}
    attack = threading.Thread(target=lambda: result.update(_slowloris(strict.http_port, conns, 10)))
    attack.start()
    time.sleep(0.3)
    latencies = _export_latencies(strict.http_port, 15)
    attack.join(15)
    assert len(result) == conns, f"only {len(result)} of {conns} slow connections were closed"
    assert max(result.values()) < 4.5  # header timeout 2 s (+ one 1 s send/select round)
    assert min(result.values()) > 1.5  # not closed before the header timeout
    assert sorted(latencies)[-1] < 1.0


def test_g55_slow_second_head_on_kept_alive_connection_gets_header_timeout(tmp_path):
    c = start_collector(CollectorConfig(data=tmp_path / "data", http_port=0, grpc_port=None,
                                        header_timeout=1.0, idle_timeout=30.0))
    try:
        conn = http.client.HTTPConnection("127.0.0.1", c.http_port, timeout=10)
        conn.request("POST", "/v1/traces", make_request([make_span(1)]).SerializeToString(), {"Content-Type": PB})
        assert conn.getresponse().read() == b""
        sock = conn.sock
        started = time.monotonic()
        closed = False
        while not closed and time.monotonic() - started < 10:
            sock.send(b"P")  # the next head, a byte every 0.3 s: the idle timeout (30 s) must not apply
            closed = bool(select.select([sock], [], [], 0.3)[0]) and _closed_by_peer(sock)
        assert closed and time.monotonic() - started < 2.5
        conn.close()
    finally:
        c.stop(1)


def test_g56_slow_body_closed_by_body_deadline_nothing_spooled(strict):
    sock = socket.create_connection(("127.0.0.1", strict.http_port))
    sock.sendall(HEAD + b"Content-Length: 1048576\r\n\r\n")
    sock.settimeout(0.1)
    started = time.monotonic()
    answer = b""
    while time.monotonic() - started < 8 and b"\r\n\r\n" not in answer:
        try:
            sock.send(b"\0" * 10)  # 10 bytes per second
        except OSError:
            break
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(4096)
            except TimeoutError:
                continue
            answer += chunk
            if not chunk or b"\r\n\r\n" in answer:
                break
    elapsed = time.monotonic() - started
    sock.close()
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert b"Connection: close" in answer
    assert 1.5 < elapsed < 4.5
    assert spool_files(strict.data) == []


def test_g57_idle_keep_alive_closed_after_idle_timeout(strict):
    conn = http.client.HTTPConnection("127.0.0.1", strict.http_port, timeout=10)
    conn.request("POST", "/v1/traces", make_request([make_span(2)]).SerializeToString(), {"Content-Type": PB})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("Connection") == "keep-alive"
    resp.read()
    sock = conn.sock
    started = time.monotonic()
    assert select.select([sock], [], [], 6)[0], "idle connection not closed within 6 s"
    assert _closed_by_peer(sock)
    assert 1.5 < time.monotonic() - started < 4
    conn.close()


def _keep_alive_export(conn: http.client.HTTPConnection, i: int) -> int:
    conn.request("POST", "/v1/traces", make_request([make_span(i)]).SerializeToString(), {"Content-Type": PB})
    resp = conn.getresponse()
    resp.read()
    return resp.status


def test_g57_connection_cap_503_while_existing_clients_keep_working(tmp_path):
    c = start_collector(CollectorConfig(data=tmp_path / "data", http_port=0, grpc_port=None, max_connections=4))
    try:
        held = [http.client.HTTPConnection("127.0.0.1", c.http_port, timeout=10) for _ in range(4)]
        assert [_keep_alive_export(h, i) for i, h in enumerate(held)] == [200] * 4
        refused = REFUSED.value(reason="connections")
        over = post(c.http_port, make_request([make_span(10)]).SerializeToString(), PB, timeout=10)
        assert over.status == 503 and over.headers["retry-after"] == "1"
        assert REFUSED.value(reason="connections") == refused + 1
        assert over.headers["connection"] == "close"
        assert [_keep_alive_export(h, 20 + i) for i, h in enumerate(held)] == [200] * 4
        held.pop().close()
        deadline = time.monotonic() + 5
        while post(c.http_port, make_request([make_span(30)]).SerializeToString(), PB).status != 200:
            assert time.monotonic() < deadline, "a freed slot was not reusable"
            time.sleep(0.05)
        for h in held:
            h.close()
    finally:
        c.stop(1)
