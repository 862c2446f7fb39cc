"""#29 serve item 6: header and body deadlines and a connection cap hold the server's file descriptors."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.serve.hostile_support import open_fds, raw_head, read_reply
from tests.serve.serve_support import Server, running_server

CAP = 20


@pytest.fixture(scope="module")
def server(serve_store: Path) -> Iterator[Server]:
    with running_server(serve_store, "--header-timeout", "1", "--body-timeout", "1",
                        "--max-connections", str(CAP)) as s:
        yield s


def _port(server: Server) -> int:
    return int(server.url.rsplit(":", 1)[1])


def test_trickling_heads_are_408_and_closed_at_the_header_deadline(server: Server) -> None:
    port = _port(server)
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(CAP // 2)]
    try:
        t0 = time.monotonic()
        for s in socks:
            s.sendall(b"GET /heal")
        time.sleep(0.5)
        for s in socks:
            s.sendall(b"t")  # a byte now and then does not extend the deadline
        replies = [read_reply(s, 5) for s in socks]
        seconds = time.monotonic() - t0
    finally:
        for s in socks:
            s.close()
    assert all(r.startswith(b"HTTP/1.1 408") for r in replies), replies[:3]
    assert seconds < 4, seconds


def test_a_trickling_body_is_408_at_the_body_deadline(server: Server) -> None:
    port = _port(server)
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(raw_head(port, "POST", "/api/sql", {"Content-Type": "application/json",
                                                      "Content-Length": "100"}) + b'{"sql": ')
        t0 = time.monotonic()
        reply = read_reply(s, 5)
    assert reply.startswith(b"HTTP/1.1 408") and time.monotonic() - t0 < 4, reply[:100]


def test_connections_over_the_cap_get_503_at_once_and_descriptors_stay_bounded(server: Server) -> None:
    port = _port(server)
    base = open_fds(server.proc.pid)
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(3 * CAP)]
    try:
        time.sleep(0.5)
        held = open_fds(server.proc.pid)
        for s in socks:
            s.setblocking(False)
        refused = 0
        for s in socks:
            with contextlib.suppress(BlockingIOError):  # not answered yet: one of the CAP held
                refused += s.recv(100).startswith(b"HTTP/1.1 503")
    finally:
        for s in socks:
            s.close()
    assert refused >= 2 * CAP - 2, refused
    assert held - base <= CAP + 5, (base, held)
    time.sleep(1.5)  # the held ones reach their header deadline
    assert httpx.get(f"{server.url}/healthz", timeout=5).json() == {"ok": True}
    assert open_fds(server.proc.pid) <= base + 2
