"""A remote tool served by a second process on another clock: ``python -m tests.remote_tool_server``.

The process has its own TracerProvider (``service.name`` = ``weather-tool-service``) whose clock is
off by ``--skew-ms`` (the SDK's ``time_ns`` shifted, as on a host whose clock drifted), serves
``GET /forecast?city=...`` through ``opentelemetry-instrumentation-wsgi`` (SERVER spans, trace
context read from the ``traceparent`` header) and runs the tool in an ``execute_tool`` span.
``city`` missing or blank: 422 (the tool rejects its arguments); ``city=Atlantis``: 500 (the tool's
backend fails). Every exported batch is appended to ``--out`` as a 4-byte length and an OTLP
``ExportTraceServiceRequest``. Prints the port, then serves until stdin closes.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import threading
from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, make_server

SERVICE = "weather-tool-service"


def _exporter(path: str) -> Any:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class FileExporter(SpanExporter):  # type: ignore[misc]
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            data = encode_spans(list(spans)).SerializeToString()
            with open(path, "ab") as f:
                f.write(struct.pack(">I", len(data)) + data)
            return SpanExportResult.SUCCESS

    return FileExporter()


def _skew_clock(skew_ns: int) -> None:
    import time

    import opentelemetry.sdk.trace as sdk_trace

    sdk_trace.time_ns = lambda: time.time_ns() + skew_ns  # type: ignore[attr-defined]


def _app(tracer: Any) -> Any:
    from opentelemetry.trace import Status, StatusCode

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        city = (parse_qs(environ.get("QUERY_STRING", "")).get("city") or [""])[0]
        attrs = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "fetch_forecast",
                 "gen_ai.tool.call.arguments": json.dumps({"city": city})}
        with tracer.start_as_current_span("execute_tool fetch_forecast", attributes=attrs,
                                          record_exception=False, set_status_on_exception=False) as span:
            if not city.strip():
                status, body = "422 Unprocessable Entity", {"error": "ValidationError: field required: city"}
            elif city == "Atlantis":
                status, body = "500 Internal Server Error", {"error": "forecast backend unavailable"}
            else:
                status, body = "200 OK", {"city": city, "forecast": "21C and sunny"}
            if not status.startswith("200"):
                span.record_exception(RuntimeError(body["error"]))
                span.set_status(Status(StatusCode.ERROR, body["error"]))
            span.set_attribute("gen_ai.tool.call.result", json.dumps(body))
        data = json.dumps(body).encode()
        start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
        return [data]

    return app


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--skew-ms", type=float, default=0.0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    from opentelemetry.instrumentation.wsgi import OpenTelemetryMiddleware
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    _skew_clock(int(args.skew_ms * 1e6))
    provider = TracerProvider(resource=Resource.create({"service.name": SERVICE, "service.version": "2.0.1"}))
    provider.add_span_processor(SimpleSpanProcessor(_exporter(args.out)))
    app = OpenTelemetryMiddleware(_app(provider.get_tracer("weather.tool")), tracer_provider=provider)
    server = make_server("127.0.0.1", 0, app, handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(server.server_address[1], flush=True)
    sys.stdin.read()  # until the parent closes our stdin
    server.shutdown()
    provider.shutdown()


if __name__ == "__main__":
    main()
