"""#29 serve item 6: header and body deadlines and a connection cap hold the server's file descriptors.

Over the cap the server stops accepting (the kernel's backlog holds the next connections) until one
closes; one accepted in the same accept round gets 503."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.serve.hostile_support import PeakRss, open_fds, raw_head, read_reply
from tests.serve.serve_support import Server, running_server
from tracedag.pipeline.serve.conns import BACKLOG

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


def test_connections_over_the_cap_wait_or_get_503_and_descriptors_stay_bounded(server: Server) -> None:
    port = _port(server)
    base = open_fds(server.proc.pid)
    with PeakRss(server.proc.pid, open_fds) as fds:
        socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(5 * CAP)]
        for s in socks:
            s.sendall(b"GET /heal")
        replies = [read_reply(s, 30) for s in socks]  # over the cap: not accepted until one closes
        for s in socks:
            s.close()
    assert all(r.startswith((b"HTTP/1.1 408", b"HTTP/1.1 503")) for r in replies), {r[:12] for r in replies}
    assert fds.peak - base <= CAP + BACKLOG + 5, (base, fds.peak)  # one accept round at most past the cap
    assert httpx.get(f"{server.url}/healthz", timeout=5).json() == {"ok": True}
    deadline = time.monotonic() + 10
    while open_fds(server.proc.pid) > base + 2 and time.monotonic() < deadline:  # the closes are processed
        time.sleep(0.2)
    assert open_fds(server.proc.pid) <= base + 2


def test_accepted_connections_send_without_nagle() -> None:
    """A reply is written as head then body; without TCP_NODELAY the body waited for the client's delayed
    ACK, ~40 ms on every keep-alive request after the first. asyncio sets it only on sockets bound with
    their protocol (IPPROTO_TCP) named, so ``bind`` must name it."""
    import asyncio

    from tracedag.pipeline.serve.conns import bind

    async def accepted_nodelay() -> int:
        seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                sock = transport.get_extra_info("socket")
                seen.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        listening = bind("127.0.0.1", 0)
        listening.listen()
        server = await asyncio.get_running_loop().create_server(Probe, sock=listening)
        client = socket.create_connection(listening.getsockname())
        try:
            return await asyncio.wait_for(seen, 10)
        finally:
            client.close()
            server.close()

    assert asyncio.run(accepted_nodelay()) != 0
