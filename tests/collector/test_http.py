"""OTLP/HTTP conformance (RELIABILITY.md A1-A14, C25-C31, E40) against the real collector on loopback."""

import gzip
import http.client
import json

from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from tests.collector.collector_support import (
    EXAMPLE_JSON,
    JSON,
    PB,
    json_doc,
    make_request,
    make_span,
    post,
    spool_files,
    stored,
)
from tracedag.collector import otlp_http
from tracedag.collector.spoolfmt import read_records
from tracedag.pipeline.convert.values import attributes_text
from tracedag.pipeline.store.views import connect


def _all_types_span(i: int):
    span = make_span(i)
    values = {
        "s": AnyValue(string_value="text"), "b": AnyValue(bool_value=True), "i": AnyValue(int_value=-(2**62)),
        "d": AnyValue(double_value=2.5), "y": AnyValue(bytes_value=b"\x00\x01\xfe"), "e": AnyValue(),
    }
    for key, value in values.items():
        kv = span.attributes.add()
        kv.key = key
        kv.value.CopyFrom(value)
    arr = span.attributes.add()
    arr.key = "a"
    arr.value.array_value.values.add().string_value = "x"
    arr.value.array_value.values.add().int_value = 7
    kvl = span.attributes.add()
    kvl.key = "k"
    inner = kvl.value.kvlist_value.values.add()
    inner.key, inner.value.bool_value = "q", False
    return span


def test_a1_protobuf_happy_path_all_anyvalue_types(collector):
    spans = [_all_types_span(i) for i in range(3)]
    r = post(collector.http_port, make_request(spans).SerializeToString())
    assert r.status == 200 and r.headers["content-type"] == PB
    resp = ExportTraceServiceResponse.FromString(r.body)
    assert not resp.HasField("partial_success")
    collector.flush()
    con = connect(collector.data)
    rows = con.sql("select span_id, trace_id, start_time_unix_nano, end_time_unix_nano, attributes from spans "
                   "order by span_id").fetchall()
    assert len(rows) == 3
    for span, (sid, tid, start, end, attrs) in zip(spans, rows, strict=True):
        assert (sid, tid) == (span.span_id.hex(), span.trace_id.hex())
        assert (start, end) == (span.start_time_unix_nano, span.end_time_unix_nano)
        assert dict(attrs) == dict(attributes_text(span.attributes)[0])


def test_a2_json_example_hex_ids(collector):
    r = post(collector.http_port, EXAMPLE_JSON, JSON)
    assert (r.status, r.headers["content-type"], r.body) == (200, JSON, b"{}")
    collector.flush()
    row = connect(collector.data).sql("select trace_id, span_id, parent_span_id from spans").fetchall()
    assert row == [("5b8efff798038103d269b633813fc60c", "eee19b7ec3c1b174", "eee19b7ec3c1b173")]


def test_a3_a4_unknown_fields_and_64bit_strings(collector):
    doc = json.loads(EXAMPLE_JSON)
    span = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    doc["whatever"] = {"x": 1}
    span["newField"] = [1, {"a": None}]
    span["endTimeUnixNano"] = str(2**53 + 1)
    r = post(collector.http_port, json.dumps(doc).encode(), JSON)
    assert r.status == 200
    collector.flush()
    assert connect(collector.data).sql("select end_time_unix_nano from spans").fetchall() == [(2**53 + 1,)]


def test_a5_enum_name_warning_in_partial_success(collector):
    doc = json.loads(EXAMPLE_JSON)
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["kind"] = "SPAN_KIND_SERVER"
    r = post(collector.http_port, json.dumps(doc).encode(), JSON)
    body = json.loads(r.body)
    assert r.status == 200 and "rejectedSpans" not in body["partialSuccess"]
    assert "SPAN_KIND_SERVER" in body["partialSuccess"]["errorMessage"]
    collector.flush()
    assert connect(collector.data).sql("select kind from spans").fetchall() == [(2,)]


def test_a6_snake_case_keys_400_mentions_lower_camel_case(collector):
    body = json_doc([{"trace_id": "01" * 16, "span_id": "02" * 8, "name": "x"}])
    r = post(collector.http_port, body, JSON)
    assert r.status == 400 and r.headers["content-type"] == JSON
    assert "lowerCamelCase" in json.loads(r.body)["message"]
    assert spool_files(collector.data) == []


def test_a7_content_type_parameters(collector):
    assert post(collector.http_port, EXAMPLE_JSON, "application/json; charset=utf-8").status == 200
    pb = make_request([make_span(5)]).SerializeToString()
    r = post(collector.http_port, pb, "application/x-protobuf; proto=opentelemetry.proto.collector.trace.v1")
    assert r.status == 200 and r.headers["content-type"] == PB


def test_a8_a9_wrong_content_type_method_path(collector):
    pb = make_request([make_span(0)]).SerializeToString()
    for ctype in ("text/plain", None, "application/grpc"):
        r = post(collector.http_port, pb, ctype)
        assert r.status == 415 and r.body
    assert post(collector.http_port, b"", PB, method="GET").status == 405
    r = post(collector.http_port, pb, PB, method="PUT")
    assert r.status == 405 and r.headers["allow"] == "POST"
    assert post(collector.http_port, pb, PB, path="/v1/other").status == 404
    assert spool_files(collector.data) == []


def test_a10_empty_requests_store_nothing(collector):
    empty_rs = make_request([])
    for body, ctype in ((b"", PB), (b"{}", JSON), (empty_rs.SerializeToString(), PB)):
        r = post(collector.http_port, body, ctype)
        assert r.status == 200
    collector.flush()
    assert spool_files(collector.data) == []
    assert stored(collector.data) == []


def test_a11_error_bodies_are_status_in_request_encoding(collector):
    bad_pb = post(collector.http_port, b"\xff\xff\xff", PB)
    assert bad_pb.status == 400 and bad_pb.headers["content-type"] == PB
    assert status_pb2.Status.FromString(bad_pb.body).message
    bad_json = post(collector.http_port, b"{nope", JSON)
    assert bad_json.status == 400 and bad_json.headers["content-type"] == JSON
    assert json.loads(bad_json.body)["message"]


def test_a12_e40_gzip_and_duplicates_stored_once(collector):
    body = make_request([make_span(i) for i in range(5)]).SerializeToString()
    assert post(collector.http_port, body).status == 200
    assert post(collector.http_port, gzip.compress(body, mtime=1), headers={"Content-Encoding": "gzip"}).status == 200
    assert post(collector.http_port, gzip.compress(body, mtime=2), headers={"Content-Encoding": "gzip"}).status == 200
    collector.flush()
    payloads = [r.payload for p in spool_files(collector.data) for r in read_records(p.read_bytes())[0]]
    assert payloads == [body, body, body]  # byte-identical after decompression
    assert len(stored(collector.data)) == 5


def test_a13_bad_encodings(collector):
    body = make_request([make_span(0)]).SerializeToString()
    for coding in ("br", "zstd", "gzip, gzip", "deflate"):
        r = post(collector.http_port, gzip.compress(body), headers={"Content-Encoding": coding})
        assert r.status == 415 and status_pb2.Status.FromString(r.body).message
    gz = gzip.compress(body)
    truncated = post(collector.http_port, gz[:-10], headers={"Content-Encoding": "gzip"})
    bad_crc = bytearray(gz)
    bad_crc[-6] ^= 0xFF
    crc = post(collector.http_port, bytes(bad_crc), headers={"Content-Encoding": "gzip"})
    assert (truncated.status, crc.status) == (400, 400)
    assert spool_files(collector.data) == []


def test_a14_never_redirects_or_deferred_acks():
    codes = set(otlp_http._REASONS)
    assert all(c == 200 or c >= 400 for c in codes)


def test_keep_alive_serves_many_requests_on_one_connection(collector):
    conn = http.client.HTTPConnection("127.0.0.1", collector.http_port, timeout=10)
    for i in range(20):
        conn.request("POST", "/v1/traces", body=make_request([make_span(i)]).SerializeToString(),
                     headers={"Content-Type": PB})
        r = conn.getresponse()
        r.read()
        assert r.status == 200 and r.getheader("Connection") == "keep-alive"
    conn.close()
    collector.flush()
    assert len(stored(collector.data)) == 20


def test_c25_truncated_protobuf_every_offset(collector):
    body = make_request([_all_types_span(i) for i in range(8)]).SerializeToString()
    conn = http.client.HTTPConnection("127.0.0.1", collector.http_port, timeout=10)
    statuses = set()
    for cut in range(0, len(body), 3):
        conn.request("POST", "/v1/traces", body=body[:cut], headers={"Content-Type": PB})
        r = conn.getresponse()
        r.read()
        statuses.add(r.status)
    assert statuses <= {200, 400}


def test_c26_invalid_utf8_rejected_nothing_stored(collector):
    body = bytearray(make_request([make_span(0)]).SerializeToString())
    body[body.index(b"span-0")] = 0xC3
    assert post(collector.http_port, bytes(body)).status == 400
    assert spool_files(collector.data) == []


def test_c27_malformed_json(collector):
    for body in (b"{} x", b'{"resourceSpans": NaN}', b'{"a": "unterminated', b"[]"):
        r = post(collector.http_port, body, JSON)
        assert r.status == 400 and json.loads(r.body)["message"]


def test_c28_c30_partial_success_exact_spans_stored(collector):
    spans = [make_span(i) for i in range(10)]
    spans[1].trace_id = b"\x01" * 15
    spans[4].span_id = bytes(8)
    spans[7].parent_span_id = b"\x02" * 3
    r = post(collector.http_port, make_request(spans).SerializeToString())
    resp = ExportTraceServiceResponse.FromString(r.body)
    assert r.status == 200 and resp.partial_success.rejected_spans == 3
    assert "trace_id" in resp.partial_success.error_message
    collector.flush()
    assert {row[2] for row in stored(collector.data)} == {f"span-{i}" for i in (0, 2, 3, 5, 6, 8, 9)}
    all_bad = [make_span(20, trace_id=bytes(16)), make_span(21, span_id=b"\x01")]
    assert post(collector.http_port, make_request(all_bad).SerializeToString()).status == 400
    collector.flush()
    assert len(stored(collector.data)) == 7


def test_c30_json_non_hex_ids_rejected_per_span(collector):
    spans = [{"traceId": "0A" * 16, "spanId": "0B" * 8, "name": "ok"}, {"traceId": "xyz", "spanId": "0B" * 8}]
    r = post(collector.http_port, json_doc(spans), JSON)
    body = json.loads(r.body)
    assert r.status == 200 and body["partialSuccess"]["rejectedSpans"] == "1"


def test_c31_c32_odd_timestamps_stored(collector):
    spans = [make_span(0, start_time_unix_nano=10, end_time_unix_nano=5), make_span(1, start_time_unix_nano=0),
             make_span(2, start_time_unix_nano=4_102_444_800_000_000_000, end_time_unix_nano=4_102_444_800_000_000_001)]
    assert post(collector.http_port, make_request(spans).SerializeToString()).status == 200
    collector.flush()
    assert len(stored(collector.data)) == 3


def test_healthz_readyz_metrics(collector):
    assert post(collector.http_port, b"", None, "/healthz", "GET").status == 200
    assert post(collector.http_port, b"", None, "/readyz", "GET").body == b"ready\n"
    post(collector.http_port, make_request([make_span(0)]).SerializeToString())
    text = post(collector.http_port, b"", None, "/metrics", "GET").body.decode()
    for name in ("tracedag_requests_total{", "tracedag_spans_accepted_total", "tracedag_spool_fsync_seconds_bucket",
                 "tracedag_received_bytes_total{", "tracedag_spool_segments", "tracedag_spool_bytes"):
        assert name in text
