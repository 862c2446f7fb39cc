"""What both receivers share: bearer tokens, admission control and the decode -> spool step.

``Ingestor.export(body, encoding)`` decodes and validates a request, appends the valid spans to
the spool and returns once they are fsynced. ``Admission`` bounds the decompressed bytes in
flight and refuses work while the spool backlog is too large, the disk is failing or the
collector shuts down (-> HTTP 503 / gRPC UNAVAILABLE, retry after 1 s).
"""

from __future__ import annotations

import hmac
import logging
import os
import ssl
import threading
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

from tracedag.collector import faults
from tracedag.collector.decode import NO_LIMITS, Decoded, DecodeError, Encoding, Limits, decode_request
from tracedag.collector.metrics import REGISTRY
from tracedag.collector.spool import SpoolUnavailable, SpoolWriter
from tracedag.schemas.errors import Retryable, TracedagError

logger = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = 1

REQUESTS = REGISTRY.counter(
    "tracedag_requests_total", "Export requests by transport and status.", ("transport", "status")
)
SPANS_ACCEPTED = REGISTRY.counter("tracedag_spans_accepted_total", "Spans acknowledged (fsynced in the spool).")
SPANS_REJECTED = REGISTRY.counter("tracedag_spans_rejected_total", "Spans rejected as invalid, by reason.", ("reason",))
BYTES_RECEIVED = REGISTRY.counter(
    "tracedag_received_bytes_total", "Request body bytes received, on the wire and decompressed.", ("stage",)
)
LATENCY = REGISTRY.histogram("tracedag_request_seconds", "Export request latency (decode + durable spool).")
TRUNCATED = REGISTRY.counter(
    "tracedag_attributes_truncated_total", "Attribute values cut to max_attribute_bytes (spans kept)."
)
REFUSED = REGISTRY.counter("tracedag_overload_refusals_total", "Requests refused with 503/UNAVAILABLE.", ("reason",))
INTERNAL_ERRORS = REGISTRY.counter(
    "tracedag_internal_errors_total", "Requests answered 500/INTERNAL after an unexpected exception.", ("transport",)
)


def internal_error(transport: str) -> str:
    """Log the exception being handled under a fresh id, count it, and return the message for the client."""
    error_id = uuid.uuid4().hex[:12]
    logger.exception("internal error %s while handling an export request (%s)", error_id, transport)
    INTERNAL_ERRORS.inc(transport=transport)
    return f"internal error {error_id} in the collector (see its log); the batch was not stored"


class Overloaded(TracedagError, Retryable):  # type: ignore[misc,unused-ignore]
    """The collector cannot take this request now (retry after ``RETRY_AFTER_SECONDS``)."""


class Admission:
    """Bounds decompressed bytes in flight and the spool backlog; says why work is refused."""

    def __init__(self, spool: SpoolWriter, max_inflight_bytes: int, max_backlog_bytes: int) -> None:
        self.spool = spool
        self.max_inflight_bytes = max_inflight_bytes
        self.max_backlog_bytes = max_backlog_bytes
        self.inflight = 0
        self.shutting_down = False
        self._lock = threading.Lock()
        self._backlog = (0, 0)
        self._backlog_at = 0.0
        REGISTRY.gauge("tracedag_inflight_bytes", "Decompressed request bytes in flight.").set_function(
            lambda: float(self.inflight)
        )

    def backlog(self) -> tuple[int, int]:
        """Return (segments, bytes) sealed and waiting for conversion, cached for 0.25 s."""
        now = time.monotonic()
        if now - self._backlog_at > 0.25:
            self._backlog, self._backlog_at = self.spool.backlog(), now
        return self._backlog

    def refusal(self) -> str | None:
        """Return why new work is refused now, or None."""
        if self.shutting_down:
            return "shutting down"
        error: str | None = self.spool.error
        if error is not None:
            return error
        if self.backlog()[1] > self.max_backlog_bytes:
            return "spool backlog full (conversion is behind)"
        return None

    def admit(self) -> str | None:
        """Like ``refusal`` for a request about to be refused: also counts the refusal."""
        reason = self.refusal()
        if reason is not None:
            REFUSED.inc(reason=_short(reason))
        return reason

    def acquire(self, nbytes: int) -> None:
        """Reserve ``nbytes`` of in-flight budget or raise ``Overloaded``."""
        with self._lock:
            if self.inflight + nbytes > self.max_inflight_bytes and self.inflight > 0:
                REFUSED.inc(reason="in-flight bytes")
                raise Overloaded("too many request bytes in flight")
            self.inflight += nbytes

    def release(self, nbytes: int) -> None:
        """Return ``nbytes`` of in-flight budget."""
        with self._lock:
            self.inflight -= nbytes


def _short(reason: str) -> str:
    if reason.startswith("disk full"):
        return "disk full"
    if reason.startswith("spool I/O"):
        return "io error"
    return reason.split(" (")[0]


class Tokens:
    """Bearer tokens (constant-time compared); those from a file are re-read when it changes."""

    def __init__(self, tokens: Iterable[str] = (), token_file: Path | None = None) -> None:
        self._static = [t.encode() for t in tokens if t]
        self._file = token_file
        self._file_tokens: list[bytes] = []
        self._mtime: float | None = None
        self._checked = 0.0
        self._lock = threading.Lock()
        self._reload()

    @property
    def enabled(self) -> bool:
        """True when any token is configured (then every export must present one)."""
        return bool(self._static) or self._file is not None

    def _reload(self) -> None:
        if self._file is None:
            return
        try:
            mtime = os.stat(self._file).st_mtime_ns
            if mtime == self._mtime:
                return
            lines = self._file.read_text().splitlines()
        except OSError as exc:
            logger.error("cannot read token file %s: %s", self._file, exc.strerror)
            return
        self._file_tokens = [ln.strip().encode() for ln in lines if ln.strip() and not ln.startswith("#")]
        self._mtime = mtime
        logger.info("loaded %d tokens from %s", len(self._file_tokens), self._file)

    def _current(self) -> list[bytes]:
        with self._lock:
            now = time.monotonic()
            if self._file is not None and now - self._checked >= 1.0:
                self._checked = now
                self._reload()
            return self._static + self._file_tokens

    def check(self, authorization: str | None) -> bool:
        """Return True when auth is off or the ``Authorization`` value carries a valid bearer token."""
        if not self.enabled:
            return True
        presented = _bearer(authorization or "")
        ok = False
        for token in self._current():
            ok |= hmac.compare_digest(presented, token)
        return ok and bool(presented)


def _bearer(header: str) -> bytes:
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return b""
    return value.strip().encode("utf-8", "replace")


class TlsFiles:
    """The server certificate, key and optional client CA (mTLS), re-read when a file changes.

    Files are checked at most once a second, on new connections only; a change that cannot be
    loaded (e.g. a half-written file) keeps the previous material and logs an error.
    """

    def __init__(self, cert: Path, key: Path, client_ca: Path | None = None) -> None:
        self.paths = (cert, key, client_ca)
        self.generation = 0
        self._lock = threading.Lock()
        self._checked = 0.0
        self._stamp = self._stamps()
        self.pem, self._context = self._load()

    @property
    def client_auth(self) -> bool:
        """True when clients must present a certificate signed by the client CA."""
        return self.paths[2] is not None

    def _stamps(self) -> tuple[tuple[int, int], ...]:
        out = []
        for path in self.paths:
            if path is not None:
                st = os.stat(path)
                out.append((st.st_mtime_ns, st.st_size))
        return tuple(out)

    def _load(self) -> tuple[tuple[bytes, bytes, bytes | None], ssl.SSLContext]:
        cert, key, ca = self.paths
        pem = (cert.read_bytes(), key.read_bytes(), ca.read_bytes() if ca is not None else None)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(str(cert), str(key))
        if ca is not None:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(cafile=str(ca))
        return pem, ctx

    def refresh(self) -> None:
        """Reload the files when they changed (rate-limited to once a second)."""
        with self._lock:
            now = time.monotonic()
            if now - self._checked < 1.0:
                return
            self._checked = now
            try:
                stamp = self._stamps()
                if stamp == self._stamp:
                    return
                self.pem, self._context = self._load()
            except (OSError, ssl.SSLError, ValueError) as exc:
                logger.error("TLS files changed but cannot be loaded (keeping the previous ones): %s", exc)
                return
            self._stamp = stamp
            self.generation += 1
            logger.info("TLS certificate reloaded (generation %d)", self.generation)

    def ssl_context(self) -> ssl.SSLContext:
        """Return the current server context (reloaded when the files changed)."""
        self.refresh()
        return self._context


class Ingestor:
    """Decode -> validate -> durable spool, with metrics; shared by both transports."""

    def __init__(self, spool: SpoolWriter, admission: Admission, limits: Limits = NO_LIMITS) -> None:
        self.spool = spool
        self.admission = admission
        self.limits = limits

    def export(self, body: bytes, encoding: Encoding) -> Decoded:
        """Store the valid spans of ``body`` durably; raise ``DecodeError``/``SpoolUnavailable``."""
        started = time.monotonic()
        faults.fail("export")
        try:
            decoded = decode_request(body, encoding, self.limits)
        except DecodeError as exc:
            SPANS_REJECTED.inc(exc.rejected, reason="request rejected as a whole")
            raise
        _count_rejections(decoded)
        if decoded.accepted:
            try:
                self.spool.append(decoded.payload, time.time_ns())
            except SpoolUnavailable:
                REFUSED.inc(reason=_short(self.spool.error or "spool I/O"))
                raise
            SPANS_ACCEPTED.inc(decoded.accepted)
        LATENCY.observe(time.monotonic() - started)
        if decoded.message:
            logger.info("export: %s", decoded.message)
        return decoded


def _count_rejections(decoded: Decoded) -> None:
    for reason, n in decoded.reasons:
        SPANS_REJECTED.inc(n, reason=reason)
    if decoded.truncated:
        TRUNCATED.inc(decoded.truncated)
