"""OTLP/gRPC receiver: ``opentelemetry.proto.collector.trace.v1.TraceService/Export``.

The request arrives as raw bytes (no double parse) and goes through the same decode -> durable
spool step as HTTP: OK only after the fsync; INVALID_ARGUMENT for bad data; partial success in
the response; UNAUTHENTICATED for a missing/wrong token; UNAVAILABLE with RetryInfo (1 s) both in
``grpc-status-details-bin`` and in the ``google.rpc.retryinfo-bin`` trailer (the only place the
Python exporter looks) when overloaded or the disk fails. Messages over the receive limit get
RESOURCE_EXHAUSTED, without RetryInfo.

grpc core's own decompression is off: it would inflate each compressed message whole (up to the
receive limit) before the in-flight budget sees a byte, 64 MiB per worker thread under a gzip
bomb. Compressed messages reach the handler as they came (grpc hides the per-message flag and
``grpc-encoding``), are recognised by their header (see ``compression_wbits``) and inflated here
a bounded step at a time, each step admitted against the same budget as HTTP.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from tracedag.collector.admission import (
    REQUESTS,
    RETRY_AFTER_SECONDS,
    Admission,
    Ingestor,
    Overloaded,
    TlsFiles,
    Tokens,
    internal_error,
)
from tracedag.collector.decode import DecodeError
from tracedag.collector.http_wire import BodySink, HttpError
from tracedag.collector.spool import SpoolUnavailable

logger = logging.getLogger(__name__)

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
MAX_SEND_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class RpcStatus(grpc.Status):  # type: ignore[misc,unused-ignore]
    """A ``grpc.Status`` for ``abort_with_status`` (code, details, trailing metadata)."""

    code: grpc.StatusCode
    details: str
    trailing_metadata: tuple[tuple[str, bytes], ...]


def unavailable(message: str) -> RpcStatus:
    """UNAVAILABLE with RetryInfo in ``grpc-status-details-bin`` and ``google.rpc.retryinfo-bin``."""
    info = error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=RETRY_AFTER_SECONDS))
    status = status_pb2.Status(code=grpc.StatusCode.UNAVAILABLE.value[0], message=message)
    status.details.add().Pack(info)
    trailing = (
        ("grpc-status-details-bin", status.SerializeToString()),
        ("google.rpc.retryinfo-bin", info.SerializeToString()),
    )
    return RpcStatus(grpc.StatusCode.UNAVAILABLE, message, trailing)


@dataclass(frozen=True)
class GrpcSettings:
    """Listening address and limits of the OTLP/gRPC receiver."""

    host: str = "127.0.0.1"
    port: int = 4317
    max_message_bytes: int = 64 * 1024 * 1024
    workers: int = 16
    tls: TlsFiles | None = None  # certificate (reloaded for new connections) and optional client CA
    max_concurrent_streams: int = 100  # HTTP/2 streams per connection (SETTINGS_MAX_CONCURRENT_STREAMS)
    min_ping_interval_ms: int = 10_000  # keepalive enforcement: pings without data more often are strikes
    max_ping_strikes: int = 2  # then GOAWAY (ENHANCE_YOUR_CALM, "too_many_pings")


def server_options(settings: GrpcSettings) -> list[tuple[str, int]]:
    """grpc server channel options: message limits, stream cap and keepalive (ping) enforcement."""
    return [
        ("grpc.max_receive_message_length", settings.max_message_bytes),
        ("grpc.max_send_message_length", MAX_SEND_BYTES),
        ("grpc.so_reuseport", 0),
        ("grpc.max_concurrent_streams", settings.max_concurrent_streams),
        ("grpc.http2.min_ping_interval_without_data_ms", settings.min_ping_interval_ms),
        ("grpc.http2.max_ping_strikes", settings.max_ping_strikes),
        ("grpc.keepalive_permit_without_calls", 0),
        ("grpc.per_message_decompression", 0),  # inflated in ``_inflate``, within the in-flight budget
    ]


def compression_wbits(message: bytes) -> int | None:
    """Return zlib's ``wbits`` when ``message`` is a gzip or zlib (gRPC "deflate") stream, else None.

    No serialized ``ExportTraceServiceRequest`` starts like either: 0x1f is field 3 with the
    invalid wire type 7, and 0x78 is a varint field 15 the message does not define (zlib's header
    also needs its check bits: (first * 256 + second) % 31 == 0).
    """
    if message[:2] == b"\x1f\x8b":
        return 31
    if len(message) >= 2 and message[0] == 0x78 and (message[0] * 256 + message[1]) % 31 == 0:
        return 15
    return None


class OtlpGrpcServer:
    """The OTLP/gRPC receiver."""

    def __init__(self, settings: GrpcSettings, ingestor: Ingestor, admission: Admission, tokens: Tokens) -> None:
        self.settings = settings
        self.ingestor = ingestor
        self.admission = admission
        self.tokens = tokens
        self.port = 0
        handler = grpc.method_handlers_generic_handler(
            SERVICE, {"Export": grpc.unary_unary_rpc_method_handler(self._export)}
        )
        self._server = grpc.server(
            ThreadPoolExecutor(settings.workers, thread_name_prefix="otlp-grpc"), handlers=[handler],
            options=server_options(settings),
        )

    def start(self) -> int:
        """Bind, start serving and return the bound port."""
        host = f"[{self.settings.host}]" if ":" in self.settings.host else self.settings.host
        address = f"{host}:{self.settings.port}"
        if self.settings.tls is not None:
            self.port = self._server.add_secure_port(address, dynamic_credentials(self.settings.tls))
        else:
            self.port = self._server.add_insecure_port(address)
        self._server.start()
        return self.port

    def stop(self, grace: float = 10.0) -> None:
        """Refuse new RPCs and let in-flight ones finish within ``grace`` seconds."""
        self._server.stop(grace).wait(grace + 1)

    def _export(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        try:
            response = self._handle(request, context)
        except Exception:
            code = context.code() if hasattr(context, "code") else None
            REQUESTS.inc(transport="grpc", status=_code_name(code))
            raise
        REQUESTS.inc(transport="grpc", status="OK")
        return response

    def _handle(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        metadata = _metadata(context.invocation_metadata())
        if not self.tokens.check(metadata.get("authorization")):
            _abort(context, grpc.StatusCode.UNAUTHENTICATED, "missing or invalid bearer token")
        reason = self.admission.admit()
        if reason is not None:
            context.abort_with_status(unavailable(f"not accepting data now: {reason}; retry later"))
        reserved = [0]
        try:
            self._reserve(reserved, len(request))
            body = self._inflate(request, reserved)
            decoded = self.ingestor.export(body, "protobuf")
        except Overloaded as exc:
            context.abort_with_status(unavailable(f"overloaded: {exc}; retry later"))
        except HttpError as exc:
            code = grpc.StatusCode.RESOURCE_EXHAUSTED if exc.status == 413 else grpc.StatusCode.INVALID_ARGUMENT
            _abort(context, code, exc.message.replace("request body", "message"))
        except DecodeError as exc:
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, exc.message)
        except SpoolUnavailable as exc:
            context.abort_with_status(unavailable(f"{exc}; retry later"))
        except Exception:  # a bug: INTERNAL with an id to find in the log, never grpc's bare UNKNOWN
            _abort(context, grpc.StatusCode.INTERNAL, internal_error("grpc"))
        finally:
            self.admission.release(reserved[0])
        resp = ExportTraceServiceResponse()
        if decoded.rejected or decoded.message:
            resp.partial_success.rejected_spans = decoded.rejected
            resp.partial_success.error_message = decoded.message
        data: bytes = resp.SerializeToString()
        return data

    def _reserve(self, reserved: list[int], nbytes: int) -> None:
        """Admit ``nbytes`` more in-flight bytes for this call (``Overloaded`` when the budget is spent)."""
        self.admission.acquire(nbytes)
        reserved[0] += nbytes

    def _inflate(self, message: bytes, reserved: list[int]) -> bytes:
        """Return ``message`` decompressed when it is compressed, admitting each inflated step."""
        wbits = compression_wbits(message)
        if wbits is None:
            return message
        sink = BodySink(self.settings.max_message_bytes, True, lambda n: self._reserve(reserved, n), wbits=wbits)
        sink.feed(message)
        body: bytes = sink.finish()
        return body


def dynamic_credentials(files: TlsFiles) -> grpc.ServerCredentials:
    """TLS credentials whose certificate grpc re-fetches on new connections (mTLS with a client CA)."""
    seen = [files.generation]

    def configuration() -> Any:
        cert, key, ca = files.pem
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def fetch() -> Any:
        files.refresh()
        if files.generation == seen[0]:
            return None
        seen[0] = files.generation
        return configuration()

    creds: grpc.ServerCredentials = grpc.dynamic_ssl_server_credentials(
        configuration(), fetch, require_client_authentication=files.client_auth
    )
    return creds


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    context.abort(code, message[:4096])
    raise AssertionError("unreachable: abort raises")


def _metadata(items: Sequence[Any] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or ():
        key, value = item[0], item[1]
        if isinstance(value, str):
            out[key.lower()] = value
    return out


def _code_name(code: object) -> str:
    if isinstance(code, grpc.StatusCode):
        return str(code.name)
    return "UNKNOWN"
