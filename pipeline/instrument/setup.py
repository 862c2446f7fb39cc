"""``configure``: an OpenTelemetry SDK TracerProvider exporting over OTLP with a batch processor.

Endpoint resolution: the argument, then ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` /
``OTEL_EXPORTER_OTLP_ENDPOINT``, then the local tracedag collector (``http://127.0.0.1:4318`` for
HTTP, ``127.0.0.1:4317`` for gRPC). The helpers in :mod:`tracedag.instrument` use the provider made
here, or the global provider when ``configure`` was never called, so they also work under a
TracerProvider the application set up itself (add :class:`LabelSpanProcessor` to it).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import version
from typing import Literal

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

from tracedag.instrument.labels import LabelSpanProcessor

logger = logging.getLogger(__name__)

Protocol = Literal["http/protobuf", "grpc"]
_DEFAULT_ENDPOINTS: dict[str, str] = {"http/protobuf": "http://127.0.0.1:4318", "grpc": "127.0.0.1:4317"}
_SCOPE = "tracedag.instrument"
_VERSION = version("tracedag")


@dataclass
class _State:
    provider: TracerProvider | None = None
    capture_content: bool = True
    # the tracer of the provider it came from (looked up once: metadata lookups are slow)
    tracer: tuple[object, trace.Tracer] | None = None


_state = _State()


def configure(
    endpoint: str | None = None,
    *,
    service_name: str | None = None,
    service_version: str | None = None,
    protocol: Protocol = "http/protobuf",
    headers: Mapping[str, str] | None = None,
    resource_attributes: Mapping[str, str] | None = None,
    capture_content: bool = True,
    set_global: bool = True,
    exporter: SpanExporter | None = None,
    schedule_delay_millis: int = 500,
) -> TracerProvider:
    """Set up a TracerProvider exporting spans over OTLP (HTTP or gRPC) with a batch processor.

    Args:
        endpoint: collector address; ``http://host:4318`` (``/v1/traces`` is appended) or gRPC ``host:4317``.
        service_name / service_version: the ``service.name`` / ``service.version`` resource attributes
            (service name: argument, then ``OTEL_SERVICE_NAME``, then ``agent``).
        protocol: ``"http/protobuf"`` or ``"grpc"``.
        capture_content: record messages, tool arguments and results (tracedag's determinism reads them).
        set_global: also install the provider as the global one when no other is installed yet.
        exporter: use this exporter instead of OTLP (tests, files).

    Returns:
        The provider; ``shutdown()`` flushes and closes it (so does the next ``configure``).
    """
    name = service_name or os.environ.get("OTEL_SERVICE_NAME") or "agent"
    attrs: dict[str, str] = {"service.name": name, **(resource_attributes or {})}
    if service_version is not None:
        attrs["service.version"] = service_version
    provider = TracerProvider(resource=Resource.create(attrs))
    provider.add_span_processor(LabelSpanProcessor())
    span_exporter = exporter or _otlp_exporter(resolve_endpoint(endpoint, protocol), protocol, headers)
    provider.add_span_processor(BatchSpanProcessor(span_exporter, schedule_delay_millis=schedule_delay_millis))
    shutdown()  # a provider configured before is flushed and closed: one at a time
    _state.provider = provider
    _state.capture_content = capture_content
    if set_global:
        _install_global(provider)
    return provider


def resolve_endpoint(endpoint: str | None, protocol: Protocol) -> str:
    """Return the endpoint to export to: argument, then the OTEL_* variables, then the local default."""
    chosen = (
        endpoint
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or _DEFAULT_ENDPOINTS[protocol]
    )
    if protocol == "http/protobuf" and not chosen.rstrip("/").endswith("/v1/traces"):
        return chosen.rstrip("/") + "/v1/traces"
    return chosen


def _otlp_exporter(endpoint: str, protocol: Protocol, headers: Mapping[str, str] | None) -> SpanExporter:
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        insecure = not endpoint.startswith("https://")
        return GrpcExporter(endpoint=endpoint, insecure=insecure, headers=dict(headers) if headers else None)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    return HttpExporter(endpoint=endpoint, headers=dict(headers) if headers else None)


def _install_global(provider: TracerProvider) -> None:
    current = trace.get_tracer_provider()
    if isinstance(current, trace.ProxyTracerProvider):
        trace.set_tracer_provider(provider)
    else:
        logger.info("a global TracerProvider is already installed; tracedag helpers use their own")


def tracer() -> trace.Tracer:
    """The tracer the helpers use: from ``configure``'s provider, else from the global one."""
    provider = _state.provider or trace.get_tracer_provider()
    cached = _state.tracer
    if cached is not None and cached[0] is provider:
        return cached[1]
    made = provider.get_tracer(_SCOPE, _VERSION)
    _state.tracer = (provider, made)
    return made


def capture_content() -> bool:
    """Whether messages, tool arguments and results are recorded."""
    return _state.capture_content


def force_flush(timeout_millis: int = 30000) -> bool:
    """Export every finished span now; True when all were exported in time."""
    if _state.provider is None:
        return True
    return _state.provider.force_flush(timeout_millis)


def shutdown() -> None:
    """Flush and close the provider made by ``configure`` (the helpers fall back to the global one)."""
    provider, _state.provider = _state.provider, None
    if provider is not None:
        provider.shutdown()
