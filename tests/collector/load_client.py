"""A load client for crash tests: real OTel SDK exporter, records the span ids of every SUCCESS.

Run as a script: ``python load_client.py {http|grpc} ENDPOINT OUT_FILE SECONDS [BATCH]``. Each batch
is a set of real SDK spans exported with the real exporter; after a SUCCESS its ``trace:span``
ids are appended to OUT_FILE (one per line, flushed). Failures are only counted.
"""

import sys
import time

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


def main() -> int:
    transport, endpoint, out_file, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    batch = int(sys.argv[5]) if len(sys.argv) > 5 else 200
    memory = InMemorySpanExporter()
    tp = TracerProvider(resource=Resource.create({"service.name": f"load-{transport}"}))
    tp.add_span_processor(SimpleSpanProcessor(memory))
    tracer = tp.get_tracer("load")
    if transport == "http":
        exporter = HttpExporter(endpoint=endpoint, timeout=3)
    else:
        exporter = GrpcExporter(endpoint=endpoint, insecure=True, timeout=3)
    deadline = time.monotonic() + seconds
    ok = failed = 0
    with open(out_file, "a") as out:
        while time.monotonic() < deadline:
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
