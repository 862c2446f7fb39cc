"""What a server without a token accepts: its own Host names, and no cross-site writes.

Without a bearer token, ``tracedag serve`` listens on loopback only, and the one left who can reach
it is a web page the operator opens: through DNS rebinding (a name of the attacker's that resolves to
127.0.0.1, so the page reads the answers) or a cross-site ``POST`` (a form or a ``no-cors`` fetch,
sent without asking). ``HostCheck`` (an ASGI middleware) refuses both:

- the ``Host`` header must be a name the server listens as: ``127.0.0.1``, ``localhost``, ``[::1]`` at
  its port, or an ``--allowed-host`` value (``name`` at the server's port, or ``name:port``);
  otherwise 421 (400 when there is no Host header);
- a ``POST`` (any method but GET, HEAD, OPTIONS) needs ``Content-Type: application/json`` or none
  at all, and an ``Origin`` that is absent or one of those names: otherwise 403. A browser sends
  ``Origin`` with every POST and cannot send JSON cross-site without a CORS preflight, which this
  server never grants; ``curl --data-binary @q.sql -H 'Content-Type:'`` and scripts still work.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass
from typing import Any

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
_SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}


@dataclass(frozen=True)
class HostPolicy:
    """The ``host:port`` names a server answers as (``port`` 0: any port of those names)."""

    port: int
    extra: tuple[str, ...] = ()

    def allows(self, host: str) -> bool:
        """Whether a ``Host`` header value (or an Origin's host part) names this server."""
        name, port = split_host(host.strip().lower())
        for allowed in (*LOOPBACK_NAMES, *(e.lower() for e in self.extra)):
            a_name, a_port = split_host(allowed)
            wanted = a_port if a_port is not None else self.port
            if name == a_name and (wanted == 0 or port == wanted):
                return True
        return False

    def allows_origin(self, origin: str) -> bool:
        """Whether an ``Origin`` header is a page of this server."""
        scheme, sep, rest = origin.strip().lower().partition("://")
        if not sep or scheme not in ("http", "https") or "/" in rest:
            return False
        return self.allows(rest if split_host(rest)[1] is not None else f"{rest}:{80 if scheme == 'http' else 443}")


def split_host(host: str) -> tuple[str, int | None]:
    """``name[:port]`` (``[v6]:port`` too) as (name, port or None); a bad port is -1."""
    if host.startswith("["):
        name, _, rest = host.partition("]")
        name += "]"
        port_text = rest[1:] if rest.startswith(":") else None
    elif host.count(":") == 1:
        name, _, port_text = host.partition(":")
    else:
        name, port_text = host, None
    if port_text is None:
        return name, None
    return name, int(port_text) if port_text.isdigit() else -1


def allowed_hosts(values: Iterable[str]) -> tuple[str, ...]:
    """``--allowed-host`` values, stripped and lower-cased (empty ones dropped)."""
    return tuple(v.strip().lower() for v in values if v.strip())


class HostCheck:
    """ASGI middleware: refuse foreign Host names (421) and cross-site writes (403)."""

    def __init__(self, app: App, policy: HostPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = self.refusal(scope)
            if refusal is not None:
                await _answer(send, *refusal)
                return
        await self.app(scope, receive, send)

    def refusal(self, scope: Scope) -> tuple[int, str] | None:
        """(status, reason) when the request is refused, else None."""
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        host = headers.get("host")
        if not host:
            return 400, "the request has no Host header"
        if not self.policy.allows(host):
            return 421, (f"this server does not answer as {host!r} (it answers as 127.0.0.1, localhost or "
                         "[::1] at its port; add a name with --allowed-host)")
        if scope.get("method", "GET") in _SAFE_METHODS:
            return None
        origin = headers.get("origin")
        if origin is not None and not self.policy.allows_origin(origin):
            return 403, f"cross-site request refused (Origin {origin!r} is not this server)"
        kind = headers.get("content-type", "").split(";")[0].strip().lower()
        if kind not in ("", "application/json"):
            return 403, f"a POST needs Content-Type: application/json (got {kind!r}): cross-site forms are refused"
        return None


async def _answer(send: Send, status: int, reason: str) -> None:
    body = json.dumps({"error": reason}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
