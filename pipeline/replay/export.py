"""Whether the spans of a replay or simulation reached the collector.

An OpenTelemetry batch processor drops the result of each export (it only logs a failure), so a
replay towards a collector that is down would look like a success. ``CountingExporter`` wraps the
OTLP exporter and counts the spans each export delivered or lost; ``probe`` sends one empty export
request before anything runs, so a collector that is not there is reported at once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from tracedag.instrument.setup import Protocol, resolve_endpoint

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Delivery:
    """Spans the collector took and spans it did not (refused, unreachable, timed out)."""

    sent: int = 0
    lost: int = 0

    @property
    def nothing_stored(self) -> bool:
        """True when spans were exported and none of them arrived."""
        return self.lost > 0 and self.sent == 0


class CountingExporter(SpanExporter):
    """A span exporter that counts the spans ``inner`` delivered and the spans it lost."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self._sent = 0
        self._lost = 0
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Export through ``inner``; an exception counts as a failed export."""
        try:
            result = self.inner.export(spans)
        except Exception:
            logger.exception("span export raised")
            result = SpanExportResult.FAILURE
        with self._lock:
            if result is SpanExportResult.SUCCESS:
                self._sent += len(spans)
            else:
                self._lost += len(spans)
        return result

    def shutdown(self) -> None:
        """Shut ``inner`` down."""
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Flush ``inner``."""
        return bool(self.inner.force_flush(timeout_millis))

    def delivery(self) -> Delivery:
        """What was delivered and lost so far."""
        with self._lock:
            return Delivery(self._sent, self._lost)


def otlp_exporter(endpoint: str, protocol: Protocol = "http/protobuf") -> SpanExporter:
    """The OTLP exporter ``tracedag.instrument.configure`` would make for ``endpoint``."""
    url = resolve_endpoint(endpoint, protocol)
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter(endpoint=url, insecure=not url.startswith("https://"))
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    return HttpExporter(endpoint=url)


def probe(endpoint: str, protocol: Protocol = "http/protobuf") -> bool:
    """True when the collector at ``endpoint`` accepts an (empty) export request."""
    exporter = otlp_exporter(endpoint, protocol)
    try:
        return exporter.export([]) is SpanExportResult.SUCCESS
    except Exception:
        logger.debug("probe of %s raised", endpoint, exc_info=True)
        return False
    finally:
        exporter.shutdown()


def unreachable_message(endpoint: str) -> str:
    """One line: the collector at ``endpoint`` took nothing, so nothing was run or stored."""
    return (f"the collector at {endpoint} does not accept spans (is `tracedag collect` running there?): "
            "nothing was run, nothing was stored")
