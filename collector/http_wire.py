"""A small, strict HTTP/1.1 request reader for the OTLP/HTTP receiver (asyncio streams).

``read_head`` parses the request line and headers (bounded size and time); ``body_chunks``
yields the raw body per ``Content-Length`` or chunked framing, never trusting a length for
allocation; ``BodySink`` collects it, decompressing gzip ``INFLATE_CHUNK`` bytes at a time so the
size limit and the in-flight budget apply to the decompressed bytes as they are produced.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

READ_SIZE = 256 * 1024
# Decompressed bytes produced per zlib call, each admitted before the next: a gzip bomb holds at most
# this much outside the in-flight budget per worker thread (one 64 MiB call per worker was 1.3 GB at 16).
INFLATE_CHUNK = 1024 * 1024


class HttpError(Exception):
    """A request error answered with ``status`` (the connection closes unless ``keep`` is set)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Head:
    """A parsed request line and headers (names lower-cased, repeated values joined)."""

    method: str
    path: str
    version: str
    headers: dict[str, str]

    def get(self, name: str, default: str = "") -> str:
        """Return a header value."""
        return self.headers.get(name, default)

    @property
    def keep_alive(self) -> bool:
        """Whether the client wants the connection kept open."""
        conn = self.get("connection").lower()
        if self.version == "HTTP/1.0":
            return "keep-alive" in conn
        return "close" not in conn


async def read_head(
    reader: asyncio.StreamReader, timeout: float, max_bytes: int, idle: float | None = None
) -> Head | None:
    """Read one request head (at most ``max_bytes``); None on a clean end of connection before any byte.

    With ``idle`` (a kept-alive connection), the first byte may take up to ``idle`` seconds and the
    rest of the head then ``timeout`` seconds; without it the whole head gets ``timeout`` seconds.
    """
    first = b""
    if idle is not None:
        first = await asyncio.wait_for(reader.read(1), idle)
        if not first:
            return None
    try:
        raw = first + await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
    except asyncio.IncompleteReadError as exc:
        if not (first + exc.partial).strip():
            return None
        raise HttpError(400, "incomplete request head") from exc
    except asyncio.LimitOverrunError as exc:
        raise HttpError(431, "request head too large") from exc
    if len(raw) > max_bytes:
        raise HttpError(431, "request head too large")
    return parse_head(raw)


def parse_head(raw: bytes) -> Head:
    """Parse the bytes of a request head (through the blank line)."""
    try:
        text = raw.decode("latin-1")
    except UnicodeDecodeError as exc:  # pragma: no cover - latin-1 decodes every byte
        raise HttpError(400, "bad request head") from exc
    lines = text.lstrip("\r\n").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise HttpError(400, "bad request line")
    method, target, version = parts
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip() or line[0] in " \t":
            raise HttpError(400, "bad header line")
        key = name.lower()
        value = value.strip()
        if key in headers:
            if key in ("content-length", "authorization", "content-type", "host"):
                if headers[key] != value or key != "content-length":
                    raise HttpError(400, f"repeated {key} header")
                continue
            value = f"{headers[key]}, {value}"
        headers[key] = value
    return Head(method, target.split("?", 1)[0], version, headers)


@dataclass
class Framing:
    """How the body is delimited: a length, chunked, or none."""

    chunked: bool
    length: int  # -1 when chunked


def framing(head: Head) -> Framing:
    """Return the body framing; reject ambiguous or unsupported framing."""
    te = head.get("transfer-encoding").lower()
    cl = head.get("content-length")
    if te:
        if cl:
            raise HttpError(400, "both Content-Length and Transfer-Encoding")
        if te != "chunked":
            raise HttpError(400, f"unsupported Transfer-Encoding {te!r}")
        return Framing(True, -1)
    if not cl:
        return Framing(False, 0)
    if not cl.isdigit() or len(cl) > 19:
        raise HttpError(400, "bad Content-Length")
    return Framing(False, int(cl))


class _Timed:
    """Awaits stream reads against one deadline, mapping stream errors to HTTP errors."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.loop = asyncio.get_running_loop()

    async def __call__(self, coro: Awaitable[bytes]) -> bytes:
        left = self.deadline - self.loop.time()
        if left <= 0:
            raise HttpError(408, "request body not received in time")
        try:
            return await asyncio.wait_for(coro, left)
        except TimeoutError as exc:
            raise HttpError(408, "request body not received in time") from exc
        except asyncio.IncompleteReadError as exc:
            raise HttpError(400, "connection closed inside the request body") from exc
        except asyncio.LimitOverrunError as exc:
            raise HttpError(400, "bad chunk framing") from exc


async def body_chunks(
    reader: asyncio.StreamReader, fr: Framing, deadline: float, whole: bool = False
) -> AsyncIterator[bytes]:
    """Yield the raw body bytes as they arrive, until ``deadline`` (loop time).

    ``whole``: a Content-Length body comes as one piece (one copy out of the stream buffer;
    the caller has already admitted that many bytes).
    """
    timed = _Timed(deadline)
    if fr.chunked:
        async for chunk in _chunked(reader, timed):
            yield chunk
    elif whole:
        if fr.length:
            yield await timed(reader.readexactly(fr.length))
    else:
        async for chunk in _exactly(reader, timed, fr.length):
            yield chunk


async def _exactly(reader: asyncio.StreamReader, timed: _Timed, size: int) -> AsyncIterator[bytes]:
    while size > 0:
        chunk = await timed(reader.read(min(size, READ_SIZE)))
        if not chunk:
            raise HttpError(400, "connection closed inside the request body")
        size -= len(chunk)
        yield chunk


async def _chunked(reader: asyncio.StreamReader, timed: _Timed) -> AsyncIterator[bytes]:
    while True:
        line = await timed(reader.readuntil(b"\r\n"))
        size_text = line.split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError as exc:
            raise HttpError(400, "bad chunk size") from exc
        if size < 0 or len(size_text) > 16:
            raise HttpError(400, "bad chunk size")
        if size == 0:
            while (await timed(reader.readuntil(b"\r\n"))) != b"\r\n":
                pass
            return
        async for chunk in _exactly(reader, timed, size):
            yield chunk
        if await timed(reader.readexactly(2)) != b"\r\n":
            raise HttpError(400, "bad chunk terminator")


class BodySink:
    """Collects the body, gunzipping it with the limit applied to the decompressed size.

    With ``defer`` the compressed bytes are kept (bounded by the wire limit and admitted) and
    inflated by ``finish``, which then runs off the event loop (zlib releases the GIL). Inflating
    produces at most ``INFLATE_CHUNK`` bytes per step; each step is checked against the limit
    (413) and passed to ``reserve`` (which may refuse it) before the next one is produced.
    ``wbits`` is zlib's: 31 for gzip only, 15 for a zlib (deflate) stream, 47 for either.
    """

    def __init__(
        self, limit: int, gzip: bool, reserve: Callable[[int], None], defer: bool = False, wbits: int = 31
    ) -> None:
        self.limit = limit
        self.parts: list[bytes] = []
        self.size = 0
        self.wire_bytes = 0
        self._reserve = reserve
        self._inflater = zlib.decompressobj(wbits=wbits) if gzip else None
        self._deferred: list[bytes] | None = [] if gzip and defer else None
        self._wire_limit = limit + limit // 100 + 65536

    def feed(self, raw: bytes) -> None:
        """Add received bytes; raise ``HttpError`` 413 over the limit, 400 for bad gzip."""
        self.wire_bytes += len(raw)
        if self._deferred is not None:
            if self.wire_bytes > self._wire_limit:
                raise HttpError(413, f"compressed request body exceeds {self._wire_limit} bytes")
            self._reserve(len(raw))
            self._deferred.append(raw)
            return
        self._inflate_or_keep(raw)

    def _inflate_or_keep(self, raw: bytes) -> None:
        if self._inflater is None:
            self._grow(raw)
            return
        try:
            self._inflate(self._inflater, raw)
        except zlib.error as exc:
            raise HttpError(400, f"bad gzip body: {exc}") from exc

    def _inflate(self, inflater: zlib._Decompress, data: bytes) -> None:
        """Inflate ``data`` one bounded step at a time (a full step may leave output pending in zlib)."""
        while True:
            if inflater.eof:
                if data or inflater.unused_data:
                    raise HttpError(400, "data after the end of the gzip stream")
                return
            step = min(INFLATE_CHUNK, self.limit - self.size + 1)
            out = inflater.decompress(data, step)
            self._grow(out)
            data = inflater.unconsumed_tail
            if not data and len(out) < step:
                if inflater.unused_data:
                    raise HttpError(400, "data after the end of the gzip stream")
                return

    def _grow(self, data: bytes) -> None:
        if self.size + len(data) > self.limit:
            raise HttpError(413, f"request body exceeds {self.limit} bytes (after decompression)")
        self._reserve(len(data))
        self.parts.append(data)
        self.size += len(data)

    def finish(self) -> bytes:
        """Return the whole (decompressed) body; raise 400 for a truncated gzip stream."""
        if self._deferred is not None:
            pending, self._deferred = self._deferred, None
            while pending:
                self._inflate_or_keep(pending.pop(0))
        if self._inflater is not None and self.wire_bytes and not self._inflater.eof:
            raise HttpError(400, "truncated gzip body")
        return self.parts[0] if len(self.parts) == 1 else b"".join(self.parts)
