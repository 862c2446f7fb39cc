"""The request decoder: OTLP/JSON by the spec's rules, id validation, nesting limits, fuzzing."""

import base64
import contextlib
import json
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from tests.collector.collector_support import EXAMPLE_JSON, make_request, make_span
from tests.fuzzing import examples
from tracedag.collector.decode import DecodeError, decode_request


def _spans(req: ExportTraceServiceRequest) -> list[Span]:
    return [s for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]


def _doc():
    return json.loads(EXAMPLE_JSON)


def _span_of(doc):
    return doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]


def test_example_json_ids_are_hex_not_base64():
    d = decode_request(EXAMPLE_JSON, "json")
    (span,) = _spans(d.request)
    assert span.trace_id.hex() == "5b8efff798038103d269b633813fc60c"
    assert span.span_id.hex() == "eee19b7ec3c1b174"
    assert span.parent_span_id.hex() == "eee19b7ec3c1b173"
    assert (d.accepted, d.rejected, d.message) == (1, 0, "")
    assert ExportTraceServiceRequest.FromString(d.payload) == d.request


def test_hex_case_insensitive_and_link_ids():
    lower, upper = _doc(), _doc()
    for doc, conv in ((lower, str.lower), (upper, str.upper)):
        sp = _span_of(doc)
        for k in ("traceId", "spanId", "parentSpanId"):
            sp[k] = conv(sp[k])
        sp["links"] = [{"traceId": conv("AB" * 16), "spanId": conv("CD" * 8)}]
    a = decode_request(json.dumps(lower).encode(), "json").request
    b = decode_request(json.dumps(upper).encode(), "json").request
    assert a == b
    assert _spans(a)[0].links[0].trace_id == bytes.fromhex("ab" * 16)


def test_unknown_fields_ignored_at_every_level():
    doc = _doc()
    doc["extra"] = 1
    doc["resourceSpans"][0]["futureField"] = {"x": [1, 2]}
    doc["resourceSpans"][0]["resource"]["unknown"] = "y"
    doc["resourceSpans"][0]["scopeSpans"][0]["scope"]["new"] = None
    _span_of(doc)["someNewThing"] = {"deep": {"deeper": True}}
    _span_of(doc)["attributes"][0]["value"]["newValueKind"] = 5
    d = decode_request(json.dumps(doc).encode(), "json")
    assert d.accepted == 1 and d.rejected == 0
    assert d.request == decode_request(EXAMPLE_JSON, "json").request


def test_64bit_integers_as_strings_and_numbers_without_rounding():
    big = 2**53 + 1
    as_num, as_str = _doc(), _doc()
    for doc, conv in ((as_num, int), (as_str, str)):
        sp = _span_of(doc)
        sp["startTimeUnixNano"] = conv(1544712660000000000)
        sp["endTimeUnixNano"] = conv(big)
        sp["attributes"].append({"key": "n", "value": {"intValue": conv(-(2**63))}})
    a = _spans(decode_request(json.dumps(as_num).encode(), "json").request)[0]
    b = _spans(decode_request(json.dumps(as_str).encode(), "json").request)[0]
    assert a == b
    assert b.end_time_unix_nano == big
    assert b.attributes[1].value.int_value == -(2**63)


def test_enum_name_accepted_with_warning():
    doc = _doc()
    _span_of(doc)["kind"] = "SPAN_KIND_SERVER"
    _span_of(doc)["status"] = {"code": "STATUS_CODE_ERROR", "message": "boom"}
    d = decode_request(json.dumps(doc).encode(), "json")
    span = _spans(d.request)[0]
    assert span.kind == 2 and span.status.code == 2
    assert d.rejected == 0 and "enum" in d.message and "SPAN_KIND_SERVER" in d.message


def test_every_anyvalue_type_including_bytes():
    doc = _doc()
    _span_of(doc)["attributes"] = [
        {"key": "s", "value": {"stringValue": "x"}},
        {"key": "b", "value": {"boolValue": True}},
        {"key": "i", "value": {"intValue": "42"}},
        {"key": "d", "value": {"doubleValue": 1.5}},
        {"key": "y", "value": {"bytesValue": base64.b64encode(b"\x00\xff").decode()}},
        {"key": "a", "value": {"arrayValue": {"values": [{"stringValue": "p"}, {"intValue": 1}]}}},
        {"key": "k", "value": {"kvlistValue": {"values": [{"key": "q", "value": {"boolValue": False}}]}}},
        {"key": "e", "value": {}},
    ]
    attrs = {kv.key: kv.value for kv in _spans(decode_request(json.dumps(doc).encode(), "json").request)[0].attributes}
    assert attrs["y"].bytes_value == b"\x00\xff"
    assert attrs["i"].int_value == 42 and attrs["d"].double_value == 1.5 and attrs["b"].bool_value
    assert attrs["a"].array_value.values[1].int_value == 1
    assert attrs["k"].kvlist_value.values[0].key == "q"
    assert attrs["e"].WhichOneof("value") is None


def _nested_json(depth: int) -> bytes:
    value = '{"kvlistValue": {"values": [{"key": "k", "value": ' * depth + '{"stringValue": "leaf"}' + "}]}}" * depth
    span = '{"traceId": "' + "01" * 16 + '", "spanId": "' + "02" * 8 + '", "attributes": [{"key": "m", "value": '
    return ('{"resourceSpans": [{"scopeSpans": [{"spans": [' + span + value + "}]}]}]}]}").encode()


def _nested_pb(depth: int) -> bytes:
    req = make_request([make_span(0)])
    kv = req.resource_spans[0].scope_spans[0].spans[0].attributes.add()
    kv.key = "m"
    v = kv.value
    for _ in range(depth):
        v = v.array_value.values.add()
    v.string_value = "leaf"
    return req.SerializeToString()


def test_depth_64_accepted_deep_nesting_rejected():
    assert decode_request(_nested_json(64), "json").accepted == 1
    deep = decode_request(_nested_pb(64), "protobuf")
    assert deep.accepted == 1 and deep.payload == _nested_pb(64)
    for body, enc in ((_nested_json(150), "json"), (_nested_pb(10_000), "protobuf")):
        with pytest.raises(DecodeError, match="deep"):
            decode_request(body, enc)
    with pytest.raises(DecodeError):
        decode_request(b"[" * 100_000 + b"]" * 100_000, "json")


@pytest.mark.parametrize("body", [b"[]", b"{", b'{"resourceSpans": NaN}', b"{} trailing", b'"str"', b"\xff\xfe",
                                  b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"name": 5}]}]}]}'])
def test_malformed_json_is_a_decode_error(body):
    with pytest.raises(DecodeError):
        decode_request(body, "json")


def test_duplicate_keys_last_wins():
    body = b'{"resourceSpans": [], "resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "' + b"01" * 16 + \
        b'", "spanId": "' + b"02" * 8 + b'", "name": "a", "name": "b"}]}]}]}'
    assert _spans(decode_request(body, "json").request)[0].name == "b"


BAD = [
    ("trace_id", b"\x01" * 8), ("trace_id", b"\x01" * 15), ("trace_id", b"\x01" * 17), ("trace_id", b""),
    ("trace_id", bytes(16)), ("span_id", b"\x01" * 7), ("span_id", b"\x01" * 9), ("span_id", bytes(8)),
    ("parent_span_id", b"\x01" * 4),
]


@pytest.mark.parametrize(("field", "value"), BAD)
def test_invalid_binary_ids_rejected_per_span(field, value):
    spans = [make_span(i) for i in range(3)]
    setattr(spans[1], field, value)
    d = decode_request(make_request(spans).SerializeToString(), "protobuf")
    assert (d.accepted, d.rejected) == (2, 1)
    assert field in d.message
    assert [s.name for s in _spans(d.request)] == ["span-0", "span-2"]


def test_link_with_wrong_id_length_rejects_span():
    span = make_span(0)
    span.links.add(trace_id=b"\x01" * 16, span_id=b"\x01" * 3)
    with pytest.raises(DecodeError, match="link"):
        decode_request(make_request([span]).SerializeToString(), "protobuf")


def test_json_bad_hex_rejects_only_that_span_and_snake_case_explained():
    spans = [{"traceId": "01" * 16, "spanId": "02" * 8}, {"traceId": "zz" * 16, "spanId": "02" * 8},
             {"traceId": "0" * 31, "spanId": "02" * 8}]
    d = decode_request(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}).encode(), "json")
    assert (d.accepted, d.rejected) == (1, 2) and "hex" in d.message
    snake = [{"trace_id": "01" * 16, "span_id": "02" * 8}]
    with pytest.raises(DecodeError, match="lowerCamelCase"):
        decode_request(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": snake}]}]}).encode(), "json")


def test_empty_requests_are_fine():
    for body, enc in ((b"", "protobuf"), (b"{}", "json"), (b'{"resourceSpans": [{"scopeSpans": [{}]}]}', "json")):
        d = decode_request(body, enc)
        assert (d.accepted, d.rejected) == (0, 0)


def test_invalid_utf8_in_string_is_a_decode_error():
    body = bytearray(make_request([make_span(0)]).SerializeToString())
    i = body.index(b"span-0")
    body[i] = 0xFF
    with pytest.raises(DecodeError):
        decode_request(bytes(body), "protobuf")


def test_truncated_protobuf_never_crashes():
    body = make_request([make_span(i) for i in range(20)]).SerializeToString()
    for cut in range(len(body)):
        with contextlib.suppress(DecodeError):
            decode_request(body[:cut], "protobuf")


_fuzz = settings(max_examples=examples(300), deadline=2000, suppress_health_check=[HealthCheck.too_slow])


@_fuzz
@given(st.binary(max_size=2000))
def test_fuzz_protobuf_only_decode_errors(body):
    started = time.monotonic()
    try:
        d = decode_request(body, "protobuf")
        assert ExportTraceServiceRequest.FromString(d.payload) == d.request
    except DecodeError:
        pass
    assert time.monotonic() - started < 2


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["resourceSpans", "scopeSpans", "spans", "traceId", "spanId", "attributes", "key",
                         "value", "stringValue", "intValue", "arrayValue", "values", "kind", "x"]), inner, max_size=4),
    max_leaves=30,
)


@_fuzz
@given(json_values)
def test_fuzz_json_only_decode_errors(doc):
    try:
        d = decode_request(json.dumps(doc).encode(), "json")
        assert d.accepted == len(_spans(d.request))
    except DecodeError:
        pass


@_fuzz
@given(st.lists(st.tuples(st.binary(max_size=20), st.binary(max_size=10)), min_size=1, max_size=10))
def test_fuzz_id_validation_counts(ids):
    spans = [make_span(i) for i in range(len(ids))]
    for span, (t, s) in zip(spans, ids, strict=True):
        span.trace_id, span.span_id = t, s
    body = make_request(spans).SerializeToString()
    valid = sum(len(t) == 16 and any(t) and len(s) == 8 and any(s) for t, s in ids)
    try:
        d = decode_request(body, "protobuf")
    except DecodeError:
        assert valid == 0
        return
    assert (d.accepted, d.rejected) == (valid, len(ids) - valid)
