"""The request path alone (``collector.server``), without any stage of the pipeline: ack means a
fsynced spool record, and the receivers stop and release the store cleanly."""

from __future__ import annotations

import subprocess
import sys

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.collector.collector_support import PB, make_request, make_span, post
from tracedag.collector.server import ReceiverConfig, start_receivers
from tracedag.collector.spoolfmt import read_records


def test_receivers_alone_ack_into_sealed_segments(tmp_path):
    data = tmp_path / "data"
    r = start_receivers(ReceiverConfig(data=data, http_port=0, grpc_port=0))
    try:
        body = make_request([make_span(i) for i in range(3)]).SerializeToString()
        assert post(r.http_port, body, PB).status == 200
        r.flush()
    finally:
        r.stop(2)
        r.release()
    sealed = sorted((data / "spool").glob("*.sealed"))
    records, tail = read_records(sealed[0].read_bytes())
    assert len(sealed) == 1 and tail.state == "clean" and len(records) == 1
    assert ExportTraceServiceRequest.FromString(records[0].payload) == ExportTraceServiceRequest.FromString(body)
    assert not (data / "tables").exists()  # nothing converted: that is the pipeline's job
    again = start_receivers(ReceiverConfig(data=data, http_port=0, grpc_port=0))  # the lock was released
    again.stop(2)
    again.release()


def test_the_request_path_imports_no_stage():
    code = ("import sys, tracedag.collector.server; "
            "print(sorted(m for m in sys.modules if m.startswith('tracedag.') and not m.startswith("
            "('tracedag.collector', 'tracedag.schemas'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_service_loads_no_stage_until_one_runs_in_process():
    """With converter processes, the receivers' process stays small (no Arrow, DuckDB or numpy)."""
    code = ("import sys, tracedag.pipeline.service; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyarrow', 'duckdb', 'numpy', 'polars')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
