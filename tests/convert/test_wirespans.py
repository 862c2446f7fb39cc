"""The lockstep span decoder (``wirespans``) on odd wire encodings: equal to the reference, or handed
over to the per-span path (``Unusual``) with the same result."""

from __future__ import annotations

import numpy as np
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from bench.gen import requests
from tracedag.pipeline.convert.records import convert_records
from tracedag.pipeline.convert.reference import convert_reference
from tracedag.pipeline.convert.wirespans import SpanBuilder, Unusual, walk

RECEIVED = 1_700_000_000_000_000_000


def _span(i: int, **fields: object) -> Span:
    span = Span(trace_id=(i + 1).to_bytes(16, "big"), span_id=(i + 7).to_bytes(8, "big"), name=f"step {i}",
                start_time_unix_nano=RECEIVED + i, end_time_unix_nano=RECEIVED + 2 * i + 5, kind=3)
    span.status.code, span.status.message = 2, f"failed {i}"
    kv = span.attributes.add()
    kv.key, kv.value.string_value = "gen_ai.operation.name", "chat"
    for k, v in fields.items():
        setattr(span, k, v)
    return span


def _request(spans: list[Span]) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    kv = rs.resource.attributes.add()
    kv.key, kv.value.string_value = "service.name", "svc"
    rs.scope_spans.add().spans.extend(spans)
    return req


def _with_raw_span(req: ExportTraceServiceRequest, raw: bytes) -> ExportTraceServiceRequest:
    """``req`` with one more span whose serialized form is exactly ``raw`` (unknown fields kept)."""
    req.resource_spans[0].scope_spans[0].spans.append(Span.FromString(raw))
    return req


def _builder_of(req: ExportTraceServiceRequest) -> SpanBuilder:
    builder = SpanBuilder()
    builder.add_payload(req.SerializeToString(), RECEIVED)
    return builder


def _same_as_reference(req: ExportTraceServiceRequest) -> None:
    ref = convert_reference([(req, RECEIVED)], "b")
    got = convert_records([(req.SerializeToString(), RECEIVED)], "b")
    assert got.table.to_pylist() == ref.table.to_pylist()
    assert got.keys.tolist() == ref.keys.tolist()


def test_agent_traces_decode_in_lockstep_equal_to_the_reference():
    reqs = list(requests(2000, seed=5))
    builder = SpanBuilder()
    for r in reqs:
        builder.add_payload(r.SerializeToString(), RECEIVED)
    table, keys, content = builder.finish("b")  # no Unusual: the common case takes the fast path
    ref = convert_reference([(r, RECEIVED) for r in reqs], "b")
    from tracedag.pipeline.normalize.spans import normalize

    assert normalize(table).to_pylist() == ref.table.to_pylist()
    assert keys.tolist() == ref.keys.tolist() and content.tolist() == ref.content.tolist()


def test_unknown_fields_are_skipped_and_kept_in_the_content_hash():
    plain = _span(1).SerializeToString()
    extra = plain + b"\xf8\x06\x2a" + b"\x82\x07\x03abc"  # field 111 varint, field 112 bytes
    req = _with_raw_span(_request([_span(0)]), extra)
    _builder_of(req).finish("b")  # decoded in lockstep
    _same_as_reference(req)


def test_fields_in_any_order_and_repeated_singular_fields_last_wins():
    span = _span(2)
    parts = [Span(name="first").SerializeToString(), span.SerializeToString()]
    req = _with_raw_span(_request([]), parts[1] + parts[0])  # name twice, the last one "first"; fields reversed
    table, _, _ = _builder_of(req).finish("b")
    assert table.column("name").to_pylist() == ["first"]
    _same_as_reference(req)


@pytest.mark.parametrize("raw_tail", [
    Span(status={"code": 1}).SerializeToString(),  # a second status message (protobuf merges them)
    b"\x2d\x01\x02\x03\x04",  # field 5 (name) with a fixed32 wire type
    b"\x0b\x0c",  # a group (wire types 3/4)
])
def test_unusual_encodings_go_to_the_per_span_path(raw_tail):
    raw = _span(3).SerializeToString() + raw_tail
    with pytest.raises(Unusual):
        builder = SpanBuilder()
        builder.raw_spans, builder.n = [raw], 1
        builder.res_index, builder.scope_index, builder.received = [0], [0], [RECEIVED]
        builder.resources, builder.services, builder.scopes = [[]], [None], [(None, None)]
        builder.finish("b")


def test_repeated_status_is_merged_like_protobuf_through_the_fallback():
    raw = _span(4).SerializeToString() + Span(status={"message": "second"}).SerializeToString()
    _same_as_reference(_with_raw_span(_request([_span(5)]), raw))


def test_odd_ids_and_negative_kind_equal_the_reference():
    spans = [_span(6, trace_id=b"\x01" * 15), _span(7, parent_span_id=b"\x02" * 8), _span(8, kind=-1),
             _span(9, span_id=b"")]
    _same_as_reference(_request(spans))


def test_invalid_utf8_name_skips_only_that_payload():
    raw = bytearray(_span(10).SerializeToString())
    at = raw.index(b"step 10")
    raw[at] = 0xFF
    good = _request([_span(11)])
    # a request whose only span has an invalid UTF-8 name, built on the wire (protobuf would refuse it)
    scope = b"\x12" + _len(bytes(raw)) + bytes(raw)
    resource_spans = b"\x12" + _len(scope) + scope
    payload_bad = b"\x0a" + _len(resource_spans) + resource_spans
    conv = convert_records([(payload_bad, RECEIVED), (good.SerializeToString(), RECEIVED)], "b")
    assert conv.bad_records == 1
    assert conv.table.column("name").to_pylist() == ["step 11"]


def _len(b: bytes) -> bytes:
    n, out = len(b), bytearray()
    while True:
        if n < 0x80:
            out.append(n)
            return bytes(out)
        out.append((n & 0x7F) | 0x80)
        n >>= 7


def test_walk_reads_every_wire_type_and_refuses_truncation():
    msg = b"\x08\x96\x01" + b"\x11" + bytes(range(8)) + b"\x1a\x03abc" + b"\x25\x01\x02\x03\x04"
    buf = np.frombuffer(msg + bytes(16), dtype=np.uint8)
    f = walk(buf, np.array([0]), np.array([len(msg)]), {1: 0, 2: 1, 3: 2, 4: 5})
    assert f.last(1, 1)[1].tolist() == [150]
    assert f.last(2, 1)[1].tolist() == [4] and f.last(4, 1)[1].tolist() == [18]
    assert f.last(3, 1)[1].tolist() == [14] and f.last(3, 1)[2].tolist() == [3]
    with pytest.raises(Unusual):
        walk(buf, np.array([0]), np.array([len(msg) - 2]), {1: 0, 2: 1, 3: 2, 4: 5})


def test_a_very_wide_span_goes_to_the_per_span_path_quickly():
    from tracedag.pipeline.convert.wirespans import MAX_STEPS

    wide = _span(12)
    for i in range(MAX_STEPS + 10):
        kv = wide.attributes.add()
        kv.key, kv.value.string_value = f"k{i}", "v"
    req = _request([_span(13), wide])
    with pytest.raises(Unusual, match="fields"):
        _builder_of(req).finish("b")
    _same_as_reference(req)
