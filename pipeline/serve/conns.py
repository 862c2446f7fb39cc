"""Connection limits of ``tracedag serve``: a header and a body deadline per request, a cap on connections.

uvicorn's HTTP/1.1 protocol (h11) waits for a request head forever and takes every connection, so
20,000 clients trickling one byte at a time held 20,000 file descriptors. ``protocol(limits)``
gives the h11 protocol the collector's limits: the head of a request must arrive within
``header_timeout`` seconds of the connection or of its first byte (408, closed), its body within
``body_timeout`` seconds of the head (408 if no answer started, closed), and a connection over
``max_connections`` gets 503 at once and is closed. Idle keep-alive connections are closed by
uvicorn after ``idle_timeout``.
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


class _Limited(H11Protocol):
    """uvicorn's h11 protocol with per-request deadlines and the connection cap (``limits``)."""

    limits = ConnLimits()
    _last_warning = 0.0  # one warning a minute at most: a flood must not flood the log too

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        self._phase: str | None = None
        self._timer: asyncio.TimerHandle | None = None
        if self.limits.max_connections and len(self.connections) > self.limits.max_connections:
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


def protocol(limits: ConnLimits) -> type[H11Protocol]:
    """The h11 protocol class for uvicorn's ``http=`` with ``limits``."""
    return type("LimitedH11Protocol", (_Limited,), {"limits": limits})


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``:``port`` (raises ``OSError`` when it is taken or not ours to bind)."""
    infos: list[Any] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock
