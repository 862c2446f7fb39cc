"""Connection limits of ``tracedag serve``: a header and a body deadline per request, a cap on connections.

uvicorn's HTTP/1.1 protocol (h11) waits for a request head forever and takes every connection, so
20,000 clients trickling one byte at a time held 20,000 file descriptors. ``protocol(limits)``
gives the h11 protocol the collector's limits: the head of a request must arrive within
``header_timeout`` seconds of the connection or of its first byte (408, closed), its body within
``body_timeout`` seconds of the head (408 if no answer started, closed), and at ``max_connections``
the server stops accepting (``AcceptGate``: the kernel's backlog of ``BACKLOG`` holds the next
ones, the rest are refused by the kernel) until one closes; one accepted over the cap anyway gets 503
and is closed. Answering 503 alone was not enough: under a flood the event loop accepted sockets
faster than it closed the refused ones (9,000 connections in 9 s held 5,700 descriptors at the
peak on a loaded machine). Idle keep-alive connections are closed by uvicorn after ``idle_timeout``.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from dataclasses import dataclass
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

logger = logging.getLogger(__name__)

BACKLOG = 128
"""The listening socket's backlog, and so the most connections one accept round of asyncio takes."""


@dataclass(frozen=True)
class ConnLimits:
    """Deadlines and the connection cap of the HTTP server."""

    header_timeout: float = 10.0
    body_timeout: float = 30.0
    idle_timeout: float = 5.0
    max_connections: int = 512


def _reply(status: int, reason: str, text: str) -> bytes:
    body = text.encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain; charset=utf-8\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode() + body


class AcceptGate:
    """Stops and restarts the event loop's accepting on a listening socket (asyncio's selector loop).

    asyncio has no public pause for a server: the gate removes the socket's reader and puts the same
    callback back. On a loop without a selector it does nothing (the 503 answer still holds)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._paused: tuple[Any, tuple[Any, ...]] | None = None

    def pause(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._paused is not None:
            return
        try:
            handle = loop._selector.get_key(self.fd).data[0]  # type: ignore[attr-defined]
            self._paused = (handle._callback, handle._args)
        except (AttributeError, KeyError, IndexError, TypeError):
            return
        loop.remove_reader(self.fd)

    def resume(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._paused is not None:
            callback, args = self._paused
            self._paused = None
            loop.add_reader(self.fd, callback, *args)


class _Limited(H11Protocol):
    """uvicorn's h11 protocol with per-request deadlines and the connection cap (``limits``)."""

    limits = ConnLimits()
    gate: AcceptGate | None = None
    _last_warning = 0.0  # one warning a minute at most: a flood must not flood the log too

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        self._phase: str | None = None
        self._timer: asyncio.TimerHandle | None = None
        cap = self.limits.max_connections
        if self.gate is not None and len(self.connections) >= cap:
            self.gate.pause(self.loop)
        if len(self.connections) > cap:
            if self.loop.time() - _Limited._last_warning > 60:
                _Limited._last_warning = self.loop.time()
                logger.warning("refusing connections: %d are open (--max-connections)", self.limits.max_connections)
            self.transport.write(_reply(503, "Service Unavailable", "too many connections; retry later"))
            self.transport.close()
            return
        self._follow()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._follow()

    def connection_lost(self, exc: Exception | None) -> None:
        self._set(None)
        super().connection_lost(exc)
        if self.gate is not None and len(self.connections) < self.limits.max_connections:
            self.gate.resume(self.loop)

    def _follow(self) -> None:
        """Arm the deadline of what the client owes now: a head (IDLE), a body (SEND_BODY), or nothing."""
        state = self.conn.their_state
        self._set("header" if state is h11.IDLE else "body" if state is h11.SEND_BODY else None)

    def _set(self, phase: str | None) -> None:
        if phase == self._phase:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._phase, self._timer = phase, None
        if phase is not None and not self.transport.is_closing():
            seconds = self.limits.header_timeout if phase == "header" else self.limits.body_timeout
            self._timer = self.loop.call_later(seconds, self._expire)

    def _expire(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        answering = self.cycle is not None and self.cycle.response_started and not self.cycle.response_complete
        if not answering:
            what = "request head" if self._phase == "header" else "request body"
            self.transport.write(_reply(408, "Request Timeout", f"the {what} did not arrive in time"))
        self.transport.close()


def protocol(limits: ConnLimits, listening: socket.socket | None = None) -> type[H11Protocol]:
    """The h11 protocol class for uvicorn's ``http=`` with ``limits`` (accepting on ``listening`` paused at
    the cap)."""
    gate = AcceptGate(listening.fileno()) if listening is not None else None
    return type("LimitedH11Protocol", (_Limited,), {"limits": limits, "gate": gate})


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``:``port`` (raises ``OSError`` when it is taken or not ours to bind)."""
    infos: list[Any] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    # the address's own protocol (IPPROTO_TCP): asyncio sets TCP_NODELAY only on sockets that name it, and
    # without it a reply written as head then body waited for the client's delayed ACK (~40 ms a request)
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock
