"""Real OTel SDK exporters (HTTP protobuf and gRPC) and raw gRPC calls against the real collector."""

import threading
import time

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.collector.collector_support import make_request, make_span, spool_files, stored
from tracedag.collector import admission as service
from tracedag.pipeline.service import CollectorConfig, start_collector

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def _finished_spans(n: int, name: str = "op"):
    """Real SDK spans (ReadableSpan) from a tracer, not exported yet."""
    memory = InMemorySpanExporter()
    tp = TracerProvider(resource=Resource.create({"service.name": "exp-test"}))
    tp.add_span_processor(SimpleSpanProcessor(memory))
    tracer = tp.get_tracer("t")
    with tracer.start_as_current_span(f"{name}-root") as root:
        root.set_attribute("gen_ai.operation.name", "invoke_agent")
        for i in range(n - 1):
            with tracer.start_as_current_span(f"{name}-{i}") as s:
                s.set_attribute("i", i)
    return list(memory.get_finished_spans())


def _ids(spans) -> set[tuple[str, str]]:
    return {(format(s.context.trace_id, "032x"), format(s.context.span_id, "016x")) for s in spans}


def _stored_ids(data) -> set[tuple[str, str]]:
    return {(t, s) for t, s, _ in stored(data)}


def test_http_exporter_protobuf_and_gzip(collector):
    url = f"http://127.0.0.1:{collector.http_port}/v1/traces"
    plain, gz = _finished_spans(5, "plain"), _finished_spans(5, "gz")
    assert HttpExporter(endpoint=url).export(plain) == SpanExportResult.SUCCESS
    assert HttpExporter(endpoint=url, compression=Compression.Gzip).export(gz) == SpanExportResult.SUCCESS
    collector.flush()
    assert _stored_ids(collector.data) == _ids(plain) | _ids(gz)


def test_grpc_exporter_plain_and_gzip(collector):
    spans, spans_gz = _finished_spans(4, "g"), _finished_spans(4, "gz")
    target = f"127.0.0.1:{collector.grpc_port}"
    assert GrpcExporter(endpoint=target, insecure=True).export(spans) == SpanExportResult.SUCCESS
    exp = GrpcExporter(endpoint=target, insecure=True, compression=grpc.Compression.Gzip)
    assert exp.export(spans_gz) == SpanExportResult.SUCCESS
    collector.flush()
    assert _stored_ids(collector.data) == _ids(spans) | _ids(spans_gz)


def _call(port: int, body: bytes, metadata=(), compression=None):
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 200 * 2**20)]) as ch:
        fn = ch.unary_unary(EXPORT)
        return fn(body, metadata=metadata, timeout=30, compression=compression)


def test_grpc_partial_success_and_invalid_argument(collector):
    spans = [make_span(i) for i in range(4)]
    spans[2].span_id = b"\x01\x02"
    resp = ExportTraceServiceResponse.FromString(_call(collector.grpc_port, make_request(spans).SerializeToString()))
    assert resp.partial_success.rejected_spans == 1 and "span_id" in resp.partial_success.error_message
    with pytest.raises(grpc.RpcError) as err:
        _call(collector.grpc_port, make_request([make_span(0, trace_id=bytes(16))]).SerializeToString())
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as err:
        _call(collector.grpc_port, b"\xff\xff\xff")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def _padded(size: int) -> bytes:
    req = make_request([make_span(0)])
    kv = req.resource_spans[0].scope_spans[0].spans[0].attributes.add()
    kv.key, kv.value.string_value = "pad", "x" * size
    return req.SerializeToString()


def test_b23_grpc_size_limit_resource_exhausted_without_retry_info(tmp_path):
    c = start_collector(CollectorConfig(data=tmp_path, http_port=None, grpc_port=0, max_body_bytes=2**20))
    try:
        assert ExportTraceServiceResponse.FromString(_call(c.grpc_port, _padded(2**20 - 200))) is not None
        for compression in (None, grpc.Compression.Gzip):
            with pytest.raises(grpc.RpcError) as err:
                _call(c.grpc_port, _padded(2**20 + 10), compression=compression)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            keys = {k for k, _ in (err.value.trailing_metadata() or ())}
            assert "google.rpc.retryinfo-bin" not in keys
    finally:
        c.stop(1)


def test_d34_grpc_unavailable_with_retry_info_in_both_places(tmp_path):
    c = start_collector(CollectorConfig(data=tmp_path, http_port=None, grpc_port=0, convert=False,
                                        max_backlog_bytes=1))
    try:
        _call(c.grpc_port, make_request([make_span(0)]).SerializeToString())
        c.flush()
        time.sleep(0.3)
        with pytest.raises(grpc.RpcError) as err:
            _call(c.grpc_port, make_request([make_span(1)]).SerializeToString())
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        trailing = dict(err.value.trailing_metadata())
        info = error_details_pb2.RetryInfo.FromString(trailing["google.rpc.retryinfo-bin"])
        assert info.retry_delay.seconds == 1  # D36: never more than 2 s
        status = status_pb2.Status.FromString(trailing["grpc-status-details-bin"])
        assert status.code == grpc.StatusCode.UNAVAILABLE.value[0]
        (detail,) = status.details
        unpacked = error_details_pb2.RetryInfo()
        assert detail.Unpack(unpacked) and unpacked.retry_delay.seconds == 1
    finally:
        c.stop(1)


def _recover_later(c, seconds: float):
    def run():
        time.sleep(seconds)
        c.admission.max_backlog_bytes = 2**40

    t = threading.Thread(target=run)
    t.start()
    return t


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_d34_real_exporters_retry_503_until_success(tmp_path, transport):
    c = start_collector(CollectorConfig(data=tmp_path, http_port=0, grpc_port=0, max_backlog_bytes=1,
                                        convert=False))
    try:
        _call(c.grpc_port, make_request([make_span(0)]).SerializeToString())
        c.flush()
        time.sleep(0.3)
        before = service.REFUSED.value(reason="spool backlog full")
        spans = _finished_spans(3, transport)
        t = _recover_later(c, 1.5)
        started = time.monotonic()
        if transport == "http":
            exp = HttpExporter(endpoint=f"http://127.0.0.1:{c.http_port}/v1/traces", timeout=10)
        else:
            exp = GrpcExporter(endpoint=f"127.0.0.1:{c.grpc_port}", insecure=True, timeout=10)
        result = exp.export(spans)
        t.join()
        assert result == SpanExportResult.SUCCESS
        assert time.monotonic() - started >= 1.0
        assert service.REFUSED.value(reason="spool backlog full") > before
    finally:
        c.stop(1)


def test_f49_tokens_with_real_exporters(tmp_path, caplog):
    c = start_collector(CollectorConfig(data=tmp_path, http_port=0, grpc_port=0, tokens=("s3cr3t-tok",)))
    try:
        url = f"http://127.0.0.1:{c.http_port}/v1/traces"
        target = f"127.0.0.1:{c.grpc_port}"
        bad = {"authorization": "Bearer leaked-candidate-999"}
        started = time.monotonic()
        assert HttpExporter(endpoint=url, headers=bad).export(_finished_spans(2)) == SpanExportResult.FAILURE
        assert GrpcExporter(endpoint=target, insecure=True, headers=bad).export(_finished_spans(2)) == \
            SpanExportResult.FAILURE
        assert time.monotonic() - started < 5  # not retried
        with pytest.raises(grpc.RpcError) as err:
            _call(c.grpc_port, make_request([make_span(0)]).SerializeToString(), metadata=tuple(bad.items()))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "leaked-candidate-999" not in (err.value.details() or "")
        assert "leaked-candidate-999" not in caplog.text
        assert spool_files(c.data) == []
        good = {"authorization": "Bearer s3cr3t-tok"}
        assert HttpExporter(endpoint=url, headers=good).export(_finished_spans(2)) == SpanExportResult.SUCCESS
        assert GrpcExporter(endpoint=target, insecure=True, headers=good).export(_finished_spans(2)) == \
            SpanExportResult.SUCCESS
    finally:
        c.stop(1)


def test_http_exporter_400_is_failure_without_retry(collector):
    spans = _finished_spans(1)
    started = time.monotonic()
    exp = HttpExporter(endpoint=f"http://127.0.0.1:{collector.http_port}/v1/traces")
    # a span with an all-zero trace id is invalid: the only span -> 400 -> FAILURE, once
    spans[0]._context = type(spans[0].context)(0, spans[0].context.span_id, False)
    assert exp.export(spans) == SpanExportResult.FAILURE
    assert time.monotonic() - started < 2
    assert service.REQUESTS.value(transport="http", status="400") >= 1
