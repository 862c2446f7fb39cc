"""Run the collector in-process: OTLP/HTTP + OTLP/gRPC receivers, spool, background conversion.

``start_collector(CollectorConfig(data=...))`` returns a ``RunningCollector`` with the bound
ports (port 0 picks free ones), ``flush()`` (seal the spool and convert everything acknowledged
so far, synchronously) and ``stop(grace_seconds)`` (drain in-flight requests, seal, convert).
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracedag.collector.convert_proc import ConverterProcess
from tracedag.collector.decode import Limits
from tracedag.collector.metrics import REGISTRY
from tracedag.collector.otlp_grpc import GrpcSettings, OtlpGrpcServer
from tracedag.collector.otlp_http import HttpSettings, OtlpHttpServer
from tracedag.collector.service import Admission, Ingestor, TlsFiles, Tokens
from tracedag.collector.spool import SEAL_AGE_SECONDS, SEGMENT_BYTES, SpoolWriter
from tracedag.collector.spoolfmt import DONE_RETENTION_SECONDS
from tracedag.collector.storelock import StoreLock
from tracedag.pipeline.errors import TracedagError

logger = logging.getLogger(__name__)

MiB = 1024 * 1024


@dataclass(frozen=True)
class CollectorConfig:
    """Everything ``start_collector`` needs; ports 0 pick free ones, None disables a transport."""

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
    convert: bool = True
    convert_process: bool = False  # convert in a child process (off this interpreter's GIL)
    convert_interval: float = 0.25
    spool_retention: float = DONE_RETENTION_SECONDS  # seconds converted segments stay in spool/done/
    build: bool = False
    build_idle_seconds: float = 30.0
    build_interval: float = 5.0
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


class RunningCollector:
    """A started collector; see ``start_collector``."""

    def __init__(self, config: CollectorConfig) -> None:
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
        self._stop = threading.Event()
        self._convert_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._converter: Any = None
        self._child: ConverterProcess | None = None
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

    # -- start -------------------------------------------------------------------------

    def start(self) -> RunningCollector:
        """Start the spool sealer, the receivers, the converter and the builder.

        The receivers bind first, so a port in use stops the start before any converter runs.
        """
        self.spool.start()
        try:
            self._start_receivers()
        except BaseException:
            self.stop(0)
            raise
        if self.config.convert and self.config.convert_process:
            self._child = ConverterProcess(self.data, self.config.convert_interval,
                                           retention=self.config.spool_retention)
            self._child.start()
            REGISTRY.add_source(self._child.metrics_text)
            self._spawn("converter-supervisor", self._supervise)
        elif self.config.convert:
            self._converter = _make_converter(self.data, self.config.spool_retention)
            self._spawn("spool-converter", self._convert_loop)
        if self.config.build:
            self._spawn("dag-builder", self._build_loop)
        self.lock.announce(host=self.config.host, http_port=self.http_port, grpc_port=self.grpc_port)
        logger.info("collector up: http=%s grpc=%s data=%s", self.http_port, self.grpc_port, self.data)
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

    def _spawn(self, name: str, target: Any) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    # -- background work ---------------------------------------------------------------

    def convert_once(self) -> Any:
        """Convert every sealed segment now (serialized with the background loop)."""
        if self._converter is None:
            return None
        with self._convert_lock:
            return self._converter.run_once()

    def _convert_loop(self) -> None:
        while not self._stop.wait(self.config.convert_interval):
            try:
                self.convert_once()
            except Exception:
                logger.exception("spool conversion round failed; retrying")

    def _supervise(self) -> None:
        while not self._stop.wait(1.0):
            if self._child is not None:
                self._child.ensure_alive()

    def _build_loop(self) -> None:
        build = _build_function()
        if build is None:
            logger.warning("--build requested but tracedag.pipeline.dag.build_store is not available")
            return
        while not self._stop.wait(self.config.build_interval):
            try:
                build(self.data, idle_seconds=self.config.build_idle_seconds)
            except Exception:
                logger.exception("DAG build round failed; retrying")

    # -- public control ----------------------------------------------------------------

    def flush(self) -> None:
        """Seal the spool and convert everything acknowledged so far, synchronously."""
        self.spool.flush()
        if self._child is not None:
            self._child.flush()
        self.convert_once()

    def stop(self, grace_seconds: float = 10.0) -> None:
        """Drain in-flight requests, seal the spool and run a final conversion."""
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
        self._stop.set()
        for thread in self._threads:
            thread.join(grace_seconds + 30)
        if self._child is not None:
            self._child.stop(grace_seconds + 60)
            REGISTRY.remove_source(self._child.metrics_text)
            if self._child.pending():
                self._converter = _make_converter(self.data, self.config.spool_retention)  # the child is gone: finish here
        try:
            self.convert_once()
        except Exception:
            logger.exception("final conversion failed; the spool keeps the data for the next start")
        self.lock.release()
        logger.info("collector stopped")


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


def start_collector(config: CollectorConfig) -> RunningCollector:
    """Start a collector in this process (threads) and return it."""
    return RunningCollector(config).start()


def _make_converter(data: Path, retention: float) -> Any:
    from tracedag.pipeline.ingest import SpoolConverter

    return SpoolConverter(data, done_retention=retention)


def _build_function() -> Any:
    try:
        from tracedag.pipeline import dag
    except ImportError:
        return None
    return getattr(dag, "build_store", None)
