"""OTLP/HTTP receiver: ``POST /v1/traces`` (protobuf and JSON, gzip), ``/metrics``, ``/healthz``, ``/readyz``.

An asyncio HTTP/1.1 server (no framework) running in its own thread. Bearer tokens are
checked on the headers before any body byte is read; the body is read under a time limit and
decompressed while streaming with the size limit applied to the decompressed bytes; the
decode + durable spool step runs in a thread pool and the 200 goes out only after the fsync.
Errors are ``google.rpc.Status`` in the request's encoding; overload and disk trouble are 503
with ``Retry-After: 1``. Never a redirect, never a 202.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import ssl
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from tracedag.collector.admission import (
    BYTES_RECEIVED,
    REFUSED,
    REQUESTS,
    RETRY_AFTER_SECONDS,
    Admission,
    Ingestor,
    Overloaded,
    Tokens,
    internal_error,
)
from tracedag.collector.decode import Decoded, DecodeError, Encoding
from tracedag.collector.http_wire import BodySink, Head, HttpError, body_chunks, framing, read_head
from tracedag.collector.metrics import REGISTRY
from tracedag.collector.spool import SpoolUnavailable

logger = logging.getLogger(__name__)

TRACES_PATH = "/v1/traces"
DRAIN_BEFORE_ANSWER = 8 * 1024 * 1024  # unread body small enough to discard and keep the connection
LINGER_SECONDS = 5.0
REFUSED_LINGER_SECONDS = 1.0
UNAUTH_LINGER_BYTES = 256 * 1024
STREAM_LIMIT = 128 * 1024  # reader buffer: the socket pauses at 2x (memory per connection outside the in-flight budget)
_MEDIA = {"application/x-protobuf": "protobuf", "application/protobuf": "protobuf", "application/json": "json"}
_REASONS = {
    200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
    408: "Request Timeout", 411: "Length Required", 413: "Content Too Large", 415: "Unsupported Media Type",
    431: "Request Header Fields Too Large", 500: "Internal Server Error", 503: "Service Unavailable",
}
_GRPC_CODE = {400: 3, 401: 16, 404: 12, 405: 12, 408: 4, 411: 3, 413: 8, 415: 3, 431: 3, 500: 13, 503: 14}


@dataclass(frozen=True)
class HttpSettings:
    """Listening address and limits of the OTLP/HTTP receiver."""

    host: str = "127.0.0.1"
    port: int = 4318
    max_body_bytes: int = 64 * 1024 * 1024
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    idle_timeout: float = 60.0
    max_connections: int = 0  # 0: no cap; over it, new connections get 503 and are closed
    max_head_bytes: int = 64 * 1024
    workers: int = 16
    tls: Callable[[], ssl.SSLContext] | None = None  # the current context for each new connection


@dataclass
class Reply:
    """One response to write."""

    status: int
    body: bytes
    content_type: str
    close: bool = False
    extra: tuple[tuple[str, str], ...] = ()


def media_encoding(content_type: str) -> Encoding | None:
    """Map a Content-Type (parameters allowed) to the OTLP encoding, or None when unsupported."""
    media = content_type.split(";", 1)[0].strip().lower()
    enc = _MEDIA.get(media)
    return "protobuf" if enc == "protobuf" else "json" if enc == "json" else None


def status_reply(status: int, message: str, encoding: Encoding | None, close: bool = False) -> Reply:
    """Return an error reply whose body is a ``google.rpc.Status`` in the request's encoding."""
    code = _GRPC_CODE.get(status, 2)
    message = message[:4096]
    extra = (("Retry-After", str(RETRY_AFTER_SECONDS)),) if status == 503 else ()
    if encoding == "json":
        body = json.dumps({"code": code, "message": message}).encode()
        return Reply(status, body, "application/json", close, extra)
    if encoding == "protobuf":
        body = status_pb2.Status(code=code, message=message).SerializeToString()
        return Reply(status, body, "application/x-protobuf", close, extra)
    return Reply(status, message.encode() + b"\n", "text/plain; charset=utf-8", close, extra)


def success_reply(decoded: Decoded, encoding: Encoding) -> Reply:
    """Return the 200 ``ExportTraceServiceResponse`` (partial success set only when needed)."""
    if encoding == "json":
        doc: dict[str, object] = {}
        if decoded.rejected or decoded.message:
            partial: dict[str, object] = {"errorMessage": decoded.message}
            if decoded.rejected:
                partial["rejectedSpans"] = str(decoded.rejected)
            doc["partialSuccess"] = partial
        return Reply(200, json.dumps(doc).encode(), "application/json")
    resp = ExportTraceServiceResponse()
    if decoded.rejected or decoded.message:
        resp.partial_success.rejected_spans = decoded.rejected
        resp.partial_success.error_message = decoded.message
    return Reply(200, resp.SerializeToString(), "application/x-protobuf")


class OtlpHttpServer:
    """The OTLP/HTTP receiver, served from a background thread."""

    def __init__(
        self, settings: HttpSettings, ingestor: Ingestor, admission: Admission, tokens: Tokens,
        readiness: Callable[[], str | None],
    ) -> None:
        self.settings = settings
        self.ingestor = ingestor
        self.admission = admission
        self.tokens = tokens
        self.readiness = readiness
        self.port = 0
        self.active = 0  # requests being processed
        self._pool = ThreadPoolExecutor(settings.workers, thread_name_prefix="otlp-http")
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._closing = False

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> int:
        """Bind, start serving in a thread and return the bound port."""
        sock = _bind(self.settings.host, self.settings.port)
        self.port = sock.getsockname()[1]
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(sock, ready), name="otlp-http", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self.port

    def _run(self, sock: socket.socket, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._connection, sock=sock, limit=STREAM_LIMIT)
        )
        ready.set()
        self._loop.run_forever()

    def begin_shutdown(self) -> None:
        """Stop accepting connections; requests arriving on open ones get 503."""
        self._closing = True
        if self._server is not None:
            self._loop.call_soon_threadsafe(self._server.close)

    def stop(self, grace: float = 10.0) -> None:
        """Finish in-flight requests (up to ``grace`` seconds), then close everything."""
        self.begin_shutdown()
        deadline = time.monotonic() + grace
        while self.active and time.monotonic() < deadline:
            time.sleep(0.02)
        if self._thread is not None and self._thread.is_alive():
            fut = asyncio.run_coroutine_threadsafe(self._close_all(), self._loop)
            fut.result(5)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
        self._pool.shutdown(wait=True)

    async def _close_all(self) -> None:
        for writer in list(self._writers):
            writer.close()
        if self._server is not None:
            self._server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- connections ---------------------------------------------------------------------

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.settings.max_connections and len(self._writers) >= self.settings.max_connections:
            await self._refuse_connection(reader, writer)
            return
        self._writers.add(writer)
        try:
            if self.settings.tls is not None:  # TLS per connection: a reloaded certificate applies at once
                await writer.start_tls(self.settings.tls(), ssl_handshake_timeout=self.settings.header_timeout)
            await self._serve(reader, writer)
        except (TimeoutError, ConnectionError, OSError, asyncio.IncompleteReadError):
            return
        except asyncio.CancelledError:  # shutdown closing an idle keep-alive connection (Ctrl-C)
            return  # ends normally: Python 3.11's stream callback would log a cancelled handler's traceback
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve requests on one connection: the first head within the header timeout, later
        ones after at most the idle timeout of silence (then the header timeout again)."""
        idle: float | None = None
        while True:
            try:
                head = await read_head(reader, self.settings.header_timeout, self.settings.max_head_bytes, idle)
            except HttpError as exc:
                await _write(writer, status_reply(exc.status, exc.message, None, close=True))
                return
            if head is None or not await self._request(head, reader, writer):
                return
            idle = self.settings.idle_timeout

    async def _refuse_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Over ``max_connections``: 503 with Retry-After at once (plain HTTP), read briefly so it arrives, close."""
        REFUSED.inc(reason="connections")
        try:
            if self.settings.tls is not None:  # no handshake for a refused connection: just close it
                return
            await _write(writer, status_reply(503, "too many connections; retry later", None, close=True))
            await _linger(reader, UNAUTH_LINGER_BYTES, REFUSED_LINGER_SECONDS)
        except (TimeoutError, ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def _request(self, head: Head, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Serve one request; return whether the connection stays open."""
        if head.path == TRACES_PATH:
            self.active += 1
            started = time.monotonic()
            try:
                reply = await self._traces(head, reader)
            except Exception:  # a bug must still answer: a dropped connection makes exporters retry forever
                reply = status_reply(500, internal_error("http"), media_encoding(head.get("content-type")), close=True)
            finally:
                self.active -= 1
            REQUESTS.inc(transport="http", status=str(reply.status))
            logger.debug("POST %s -> %d in %.1f ms", head.path, reply.status, (time.monotonic() - started) * 1e3)
        else:
            reply = await self._other(head, reader)
        keep = head.keep_alive and not reply.close and not self._closing
        reply.close = not keep
        await _write(writer, reply)
        if reply.close and reply.status >= 400:
            # unauthenticated clients get almost nothing read; others are read out so they see the answer
            await _linger(reader, UNAUTH_LINGER_BYTES if reply.status == 401 else self.settings.max_body_bytes)
        return keep

    async def _other(self, head: Head, reader: asyncio.StreamReader) -> Reply:
        paths = {"/metrics": self._metrics, "/healthz": _healthz, "/readyz": self._readyz}
        enc = media_encoding(head.get("content-type"))
        handler = paths.get(head.path)
        if handler is None:
            reply = status_reply(404, f"no such path {head.path!r}; OTLP traces go to {TRACES_PATH}", enc)
        elif head.method not in ("GET", "HEAD"):
            reply = status_reply(405, f"{head.method} not allowed on {head.path}", enc)
            reply.extra += (("Allow", "GET, HEAD"),)
        else:
            reply = handler()
        if not await self._skip_body(head, reader):
            reply.close = True
        if head.method == "HEAD":
            reply.body = b""
        return reply

    async def _skip_body(self, head: Head, reader: asyncio.StreamReader) -> bool:
        """Discard a small request body; return False when it must be abandoned (close)."""
        try:
            fr = framing(head)
        except HttpError:
            return False
        if fr.chunked or fr.length > DRAIN_BEFORE_ANSWER:
            return bool(fr.length == 0)
        deadline = self._loop.time() + self.settings.body_timeout
        try:
            async for _ in body_chunks(reader, fr, deadline):
                pass
        except HttpError:
            return False
        return True

    def _metrics(self) -> Reply:
        return Reply(200, REGISTRY.render().encode(), "text/plain; version=0.0.4; charset=utf-8")

    def _readyz(self) -> Reply:
        reason = "shutting down" if self._closing else self.readiness()
        if reason:
            return Reply(503, f"not ready: {reason}\n".encode(), "text/plain; charset=utf-8")
        return Reply(200, b"ready\n", "text/plain; charset=utf-8")

    # -- /v1/traces ----------------------------------------------------------------------

    async def _traces(self, head: Head, reader: asyncio.StreamReader) -> Reply:
        enc = media_encoding(head.get("content-type"))
        reply = self._precheck(head, enc)
        if reply is not None:
            if not reply.close and not await self._skip_body(head, reader):
                reply.close = True
            return reply
        assert enc is not None
        fr = framing(head)
        gzip = head.get("content-encoding").strip().lower() == "gzip"
        whole = not gzip and not fr.chunked  # known size: admit it up front, read it in one piece
        chunks = body_chunks(reader, fr, self._loop.time() + self.settings.body_timeout, whole)
        reserved = [0]

        def reserve(n: int) -> None:
            """Admit ``n`` more decompressed bytes."""
            self.admission.acquire(n)
            reserved[0] += n

        sink = BodySink(self.settings.max_body_bytes, gzip, _no_reserve if whole else reserve, defer=True)
        try:
            if whole:
                reserve(fr.length)
            return await self._receive_and_store(enc, chunks, sink)
        except HttpError as exc:
            reply = status_reply(exc.status, exc.message, enc)
        except Overloaded as exc:
            reply = status_reply(503, f"overloaded: {exc}; retry later", enc)
        finally:
            self.admission.release(reserved[0])
        rest = -1 if fr.chunked or reply.status == 408 else fr.length - sink.wire_bytes
        if whole and not sink.wire_bytes:  # refused before reading: drain piecewise, not as one body
            chunks = body_chunks(reader, fr, self._loop.time() + self.settings.body_timeout, False)
        return await _abandon(reply, chunks, rest)

    def _precheck(self, head: Head, enc: Encoding | None) -> Reply | None:
        """Everything decided on headers alone: method, token, media type, encoding, size, admission."""
        if head.method != "POST":
            reply = status_reply(405, f"{head.method} not allowed on {TRACES_PATH}; use POST", enc)
            reply.extra += (("Allow", "POST"),)
            return reply
        if not self.tokens.check(head.get("authorization") or None):
            return status_reply(401, "missing or invalid bearer token", enc or "protobuf", close=True)
        if enc is None:
            ctype = head.get("content-type") or "none"
            return status_reply(
                415, f"unsupported Content-Type {ctype[:100]!r}; use application/x-protobuf or application/json", None
            )
        coding = head.get("content-encoding").strip().lower()
        if coding not in ("", "identity", "gzip"):
            return status_reply(415, f"unsupported Content-Encoding {coding[:100]!r}; use gzip or none", enc)
        try:
            fr = framing(head)
        except HttpError as exc:
            return status_reply(exc.status, exc.message, enc, close=True)
        if not fr.chunked and not head.get("content-length"):
            # no framing: the body would be read as the next request (HTTP/1.0) or taken as empty
            return status_reply(411, "Content-Length or chunked Transfer-Encoding required", enc, close=True)
        if fr.length > self._wire_limit(coding == "gzip"):
            return status_reply(413, f"request body exceeds {self.settings.max_body_bytes} bytes", enc, close=True)
        reason = "shutting down" if self._closing else self.admission.admit()
        if reason is not None:
            return status_reply(503, f"not accepting data now: {reason}; retry later", enc)
        return None

    def _wire_limit(self, gzip: bool) -> int:
        limit = self.settings.max_body_bytes
        return limit + limit // 100 + 65536 if gzip else limit

    async def _receive_and_store(self, enc: Encoding, chunks: AsyncIterator[bytes], sink: BodySink) -> Reply:
        async for chunk in chunks:
            sink.feed(chunk)
        try:
            decoded = await self._loop.run_in_executor(self._pool, _finish_and_export, sink, self.ingestor, enc)
        except DecodeError as exc:
            return status_reply(400, exc.message, enc)
        except SpoolUnavailable as exc:
            return status_reply(503, f"{exc}; retry later", enc)
        return success_reply(decoded, enc)


async def _abandon(reply: Reply, chunks: AsyncIterator[bytes], rest: int) -> Reply:
    """After an error mid-body: discard a small known rest and keep the connection, else close."""
    if rest < 0 or rest > DRAIN_BEFORE_ANSWER:
        reply.close = True
        return reply
    try:
        async for _ in chunks:
            pass
    except HttpError:
        reply.close = True
    return reply


def _finish_and_export(sink: BodySink, ingestor: Ingestor, enc: Encoding) -> Decoded:
    """Off the event loop: inflate (if gzip), then decode and store durably."""
    body = sink.finish()
    BYTES_RECEIVED.inc(sink.wire_bytes, stage="wire")
    BYTES_RECEIVED.inc(len(body), stage="decompressed")
    return ingestor.export(body, enc)


def _no_reserve(n: int) -> None:
    """Bytes already admitted up front."""


def _healthz() -> Reply:
    return Reply(200, b"ok\n", "text/plain; charset=utf-8")


async def _write(writer: asyncio.StreamWriter, reply: Reply) -> None:
    lines = [f"HTTP/1.1 {reply.status} {_REASONS.get(reply.status, 'Error')}"]
    lines.append(f"Content-Type: {reply.content_type}")
    lines.append(f"Content-Length: {len(reply.body)}")
    lines += [f"{k}: {v}" for k, v in reply.extra]
    lines.append("Connection: close" if reply.close else "Connection: keep-alive")
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + reply.body)
    await asyncio.wait_for(writer.drain(), 30)


async def _linger(reader: asyncio.StreamReader, limit: int, seconds: float = LINGER_SECONDS) -> None:
    """Before closing after an error, read and drop what the client is still sending (briefly)."""
    deadline = asyncio.get_running_loop().time() + seconds
    seen = 0
    try:
        while seen <= limit:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return
            chunk = await asyncio.wait_for(reader.read(256 * 1024), left)
            if not chunk:
                return
            seen += len(chunk)
    except (TimeoutError, ConnectionError, OSError):
        return


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=1024, reuse_port=False)
    sock.setblocking(False)
    return sock
