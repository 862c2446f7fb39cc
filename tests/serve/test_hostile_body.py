"""#29 serve item 2: a request body's size is checked before it is read, and a chunked body is cut at the limit."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.serve.hostile_support import PeakRss, raw_head, read_reply, rss_bytes
from tests.serve.serve_support import Server, running_server

LIMIT = 4 << 20  # the body limit of POST /api/sql


@pytest.fixture(scope="module")
def server(serve_store: Path) -> Iterator[Server]:
    with running_server(serve_store) as s:
        yield s


def _port(server: Server) -> int:
    return int(server.url.rsplit(":", 1)[1])


def test_a_1_gb_content_length_is_413_before_any_of_the_body_is_read(server: Server) -> None:
    port = _port(server)
    before = rss_bytes(server.proc.pid)
    with socket.create_connection(("127.0.0.1", port)) as s:
        head = raw_head(port, "POST", "/api/sql", {"Content-Type": "application/json",
                                                   "Content-Length": str(1 << 30)})
        t0 = time.monotonic()
        s.sendall(head + b'{"sql": "select 1 -- ')  # and nothing more: the server must not wait for it
        reply = read_reply(s, 10)
        seconds = time.monotonic() - t0
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    assert b"larger than 4 MiB" in reply and seconds < 5, seconds
    assert rss_bytes(server.proc.pid) - before < 50 << 20


def test_a_chunked_body_is_cut_at_the_limit_and_the_rest_never_read(server: Server) -> None:
    port = _port(server)
    chunk = b"-" * 65536
    framed = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    sent, reply = 0, b""
    with PeakRss(server.proc.pid) as peak, socket.create_connection(("127.0.0.1", port)) as s:
        base = peak.peak
        s.sendall(raw_head(port, "POST", "/api/sql", {"Content-Type": "application/json",
                                                      "Transfer-Encoding": "chunked"}))
        s.settimeout(2)
        try:
            while sent < 256 << 20:  # today all 256 MiB were read before the answer
                s.sendall(framed)
                sent += len(chunk)
        except (TimeoutError, BrokenPipeError, ConnectionResetError):
            pass  # the server stopped reading
        reply = read_reply(s, 10)
    assert reply.startswith(b"HTTP/1.1 413"), (sent, reply[:200])
    assert sent < LIMIT + (32 << 20), sent  # the limit plus what the sockets' buffers hold
    assert peak.peak - base < 100 << 20


def test_a_body_within_the_limit_is_read_whole(server: Server) -> None:
    port = _port(server)
    body = b'{"sql": "select 42 as n"}'
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(raw_head(port, "POST", "/api/sql", {"Content-Type": "application/json",
                                                      "Content-Length": str(len(body))}) + body)
        reply = read_reply(s, 60)
    assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b'"rows":[{"n": 42}],"truncated":false}')
