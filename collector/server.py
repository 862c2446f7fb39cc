"""The request path in-process: OTLP/HTTP + OTLP/gRPC receivers in front of the durable spool.

``start_receivers(ReceiverConfig(data=...))`` takes the store's collector lock, recovers the
spool, binds the receivers (port 0 picks free ones) and returns ``Receivers`` with the bound
ports, ``flush()`` (seal the open segment now) and ``stop(grace_seconds)`` (drain in-flight
requests, seal). Converting the spool to Parquet is not done here: ``tracedag.pipeline.service``
runs the converters beside these receivers.
"""

from __future__ import annotations

import errno
import logging
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tracedag.collector.admission import Admission, Ingestor, TlsFiles, Tokens
from tracedag.collector.decode import Limits
from tracedag.collector.metrics import REGISTRY
from tracedag.collector.otlp_grpc import GrpcSettings, OtlpGrpcServer
from tracedag.collector.otlp_http import HttpSettings, OtlpHttpServer
from tracedag.collector.spool import SEAL_AGE_SECONDS, SEGMENT_BYTES, SpoolWriter
from tracedag.collector.storelock import StoreLock
from tracedag.schemas.errors import TracedagError

logger = logging.getLogger(__name__)

MiB = 1024 * 1024


@dataclass(frozen=True)
class ReceiverConfig:
    """Everything the request path needs; ports 0 pick free ones, None disables a transport."""

    data: Path
    host: str = "127.0.0.1"
    http_port: int | None = 4318
    grpc_port: int | None = 4317
    tokens: tuple[str, ...] = ()
    token_file: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None  # mTLS: clients must present a certificate signed by this CA
    max_body_bytes: int = 64 * MiB
    max_attribute_bytes: int | None = None  # cut longer string/bytes attribute values (None: keep whole)
    max_span_attributes: int | None = None  # reject spans with more attributes (None: no limit)
    max_span_events: int | None = None  # reject spans with more events (None: no limit)
    max_inflight_bytes: int = 128 * MiB
    max_backlog_bytes: int = 1024 * MiB
    segment_bytes: int = SEGMENT_BYTES
    seal_age: float = SEAL_AGE_SECONDS
    workers: int = 16
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    idle_timeout: float = 60.0  # keep-alive connections silent this long are closed
    max_connections: int = 0  # HTTP connections at once (0: no cap); over it: 503 and close


class Receivers:
    """The started request path of one data directory; see ``start_receivers``."""

    def __init__(self, config: ReceiverConfig) -> None:
        self.config = config
        self.data = Path(config.data)
        self.lock = StoreLock(self.data).acquire()  # before recovery touches another collector's segments
        try:
            self.spool = SpoolWriter(self.data, config.segment_bytes, config.seal_age)
        except BaseException:
            self.lock.release()
            raise
        self.admission = Admission(self.spool, config.max_inflight_bytes, config.max_backlog_bytes)
        self.tokens = Tokens(config.tokens, config.token_file)
        limits = Limits(config.max_attribute_bytes, config.max_span_attributes, config.max_span_events)
        self.ingestor = Ingestor(self.spool, self.admission, limits)
        self.http: OtlpHttpServer | None = None
        self.grpc: OtlpGrpcServer | None = None
        self.http_port = 0
        self.grpc_port = 0
        self._stopped = False
        self._register_gauges()

    def _register_gauges(self) -> None:
        REGISTRY.gauge("tracedag_spool_segments", "Sealed spool segments waiting for conversion.").set_function(
            lambda: float(self.admission.backlog()[0])
        )
        REGISTRY.gauge("tracedag_spool_bytes", "Bytes of sealed spool segments waiting for conversion.").set_function(
            lambda: float(self.admission.backlog()[1])
        )
        REGISTRY.gauge("tracedag_ready", "1 when the collector accepts data, else 0.").set_function(
            lambda: 0.0 if self.readiness() else 1.0
        )

    def readiness(self) -> str | None:
        """Return why the collector is not ready, or None when it is."""
        reason: str | None = self.admission.refusal()
        return reason

    def start(self) -> Receivers:
        """Start the spool sealer and bind the receivers; on failure release everything and raise."""
        self.spool.start()
        try:
            self._start_receivers()
        except BaseException:
            self.stop(0)
            self.release()
            raise
        self.lock.announce(host=self.config.host, http_port=self.http_port, grpc_port=self.grpc_port)
        logger.info("receivers up: http=%s grpc=%s data=%s", self.http_port, self.grpc_port, self.data)
        return self

    def _start_receivers(self) -> None:
        cfg = self.config
        tls = TlsFiles(cfg.tls_cert, cfg.tls_key, cfg.tls_client_ca) if cfg.tls_cert and cfg.tls_key else None
        if cfg.http_port is not None:
            settings = HttpSettings(
                cfg.host, cfg.http_port, cfg.max_body_bytes, cfg.header_timeout, cfg.body_timeout,
                idle_timeout=cfg.idle_timeout, max_connections=cfg.max_connections, workers=cfg.workers,
                tls=tls.ssl_context if tls else None,
            )
            http = OtlpHttpServer(settings, self.ingestor, self.admission, self.tokens, self.readiness)
            with _port_error("OTLP/HTTP", cfg.host, cfg.http_port, "--http-port"):
                self.http_port = http.start()
            self.http = http
        if cfg.grpc_port is not None:
            gsettings = GrpcSettings(cfg.host, cfg.grpc_port, cfg.max_body_bytes, cfg.workers, tls)
            grpc = OtlpGrpcServer(gsettings, self.ingestor, self.admission, self.tokens)
            with _port_error("OTLP/gRPC", cfg.host, cfg.grpc_port, "--grpc-port"):
                _probe_bind(cfg.host, cfg.grpc_port)  # grpc's own bind failure also logs a C-core error line
                self.grpc_port = grpc.start()
            self.grpc = grpc

    def flush(self) -> None:
        """Seal the open spool segment now (everything acknowledged so far becomes convertible)."""
        self.spool.flush()

    def stop(self, grace_seconds: float = 10.0) -> None:
        """Drain in-flight requests (up to ``grace_seconds``), then seal and close the spool.

        The store lock stays held: ``release()`` drops it once the caller's own work on the
        store (a final conversion) is done.
        """
        if self._stopped:
            return
        self._stopped = True
        self.admission.shutting_down = True
        if self.http is not None:
            self.http.begin_shutdown()
        if self.grpc is not None:
            self.grpc.stop(grace_seconds)
        if self.http is not None:
            self.http.stop(grace_seconds)
        self.spool.close()

    def release(self) -> None:
        """Drop the store's collector lock (after ``stop``)."""
        self.lock.release()


class PortUnavailable(TracedagError):  # type: ignore[misc,unused-ignore]
    """A receiver could not bind its port."""

    def __init__(self, what: str, host: str, port: int, option: str, reason: str) -> None:
        super().__init__(
            f"{what} port {port} on {host} is not available ({reason}); choose another with {option} "
            "(0 picks a free port)"
        )
        self.port = port


@contextmanager
def _port_error(what: str, host: str, port: int, option: str) -> Iterator[None]:
    """Turn a failed bind into ``PortUnavailable`` naming the port and the option that sets it."""
    try:
        yield
    except OSError as exc:
        reason = "already in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
        raise PortUnavailable(what, host, port, option, reason) from exc
    except RuntimeError as exc:  # grpc: "Failed to bind to address ..."
        raise PortUnavailable(what, host, port, option, "already in use or not bindable") from exc


def _probe_bind(host: str, port: int) -> None:
    """Raise ``OSError`` when ``host:port`` cannot be bound (as grpc binds it: SO_REUSEADDR, no reuseport)."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))


def start_receivers(config: ReceiverConfig) -> Receivers:
    """Take the store, recover the spool and start the receivers in this process (threads)."""
    return Receivers(config).start()
