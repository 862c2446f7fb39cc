"""A load client for crash tests: real OTel SDK exporter, records the span ids of every SUCCESS.

Run as a script: ``python load_client.py {http|grpc|json} ENDPOINT OUT_FILE SECONDS [BATCH [RATE]]``
(RATE: spans/s, default unpaced). Each
batch is a set of real SDK spans exported with the real exporter (OTLP/HTTP protobuf, OTLP/gRPC, or
OTLP/HTTP JSON from ``opentelemetry-exporter-otlp-json-http``); after a SUCCESS its ``trace:span``
ids are appended to OUT_FILE (one per line, flushed). Failures are only counted. Only the chosen
exporter is imported, so the script also runs in the pinned venvs of other SDK versions
(``test_collector_crash.py``).
"""

import sys
import time
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


def make_exporter(transport: str, endpoint: str) -> Any:
    """The real exporter of ``transport`` (imported here: each venv has only some of them)."""
    if transport == "http":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=endpoint, timeout=3)
    if transport == "json":
        from opentelemetry.exporter.otlp.json.http.trace_exporter import OTLPSpanExporter as JsonExporter

        return JsonExporter(endpoint=endpoint, timeout=3)
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

    return GrpcExporter(endpoint=endpoint, insecure=True, timeout=3)


def main() -> int:
    transport, endpoint, out_file, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    batch = int(sys.argv[5]) if len(sys.argv) > 5 else 200
    rate = float(sys.argv[6]) if len(sys.argv) > 6 else 0.0
    memory = InMemorySpanExporter()
    tp = TracerProvider(resource=Resource.create({"service.name": f"load-{transport}"}))
    tp.add_span_processor(SimpleSpanProcessor(memory))
    tracer = tp.get_tracer("load")
    exporter = make_exporter(transport, endpoint)
    start = time.monotonic()
    deadline = start + seconds
    ok = failed = sent = 0
    with open(out_file, "a") as out:
        while time.monotonic() < deadline:
            if rate and (ahead := start + sent / rate - time.monotonic()) > 0:
                time.sleep(ahead)
            sent += batch
            memory.clear()
            with tracer.start_as_current_span("agent") as root:
                root.set_attribute("gen_ai.input.messages", "x" * 300)
                for i in range(batch - 1):
                    with tracer.start_as_current_span(f"step-{i}") as s:
                        s.set_attribute("i", i)
            spans = memory.get_finished_spans()
            if exporter.export(spans) == SpanExportResult.SUCCESS:
                out.write("".join(f"{s.context.trace_id:032x}:{s.context.span_id:016x}\n" for s in spans))
                out.flush()
                ok += 1
            else:
                failed += 1
                time.sleep(0.2)
    print(f"ok={ok} failed={failed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
