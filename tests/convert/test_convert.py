"""The fast columnar converter equals the reference loop; OTLP -> Parquet -> OTLP keeps every field."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from bench.gen import requests
from tests.fuzzing import examples
from tracedag.pipeline.convert.pool import convert_parallel
from tracedag.pipeline.convert.records import convert_fast, convert_records, convert_wire
from tracedag.pipeline.convert.reference import convert_reference
from tracedag.pipeline.convert.values import any_value_text
from tracedag.pipeline.store.parquet import write_atomic

_TEXT = st.text(max_size=12)
_I64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
_TIME = st.integers(min_value=0, max_value=2**63 - 1)


def _any_value(depth: int = 0) -> st.SearchStrategy[AnyValue]:
    scalars = st.one_of(
        _TEXT.map(lambda s: AnyValue(string_value=s)),
        st.booleans().map(lambda b: AnyValue(bool_value=b)),
        _I64.map(lambda i: AnyValue(int_value=i)),
        st.floats(allow_nan=False).map(lambda f: AnyValue(double_value=f)),
        st.binary(max_size=8).map(lambda b: AnyValue(bytes_value=b)),
        st.just(AnyValue()),
    )
    if depth >= 2:
        return scalars

    def arr(vals: list[AnyValue]) -> AnyValue:
        v = AnyValue()
        v.array_value.values.extend(vals)
        return v

    def kvl(items: list[tuple[str, AnyValue]]) -> AnyValue:
        v = AnyValue()
        v.kvlist_value.values.extend(KeyValue(key=k, value=x) for k, x in items)
        return v

    inner = _any_value(depth + 1)
    return st.one_of(scalars, st.lists(inner, max_size=3).map(arr),
                     st.lists(st.tuples(_TEXT, inner), max_size=3).map(kvl))


_ATTRS = st.lists(st.tuples(st.sampled_from(["a", "b", "gen_ai.system", "k"]) | _TEXT, _any_value()), max_size=5)


@st.composite
def spans(draw: st.DrawFn) -> Span:
    """A random span: ids of any length (the converter must not care), any times, status, events, links."""
    s = Span(
        trace_id=draw(st.binary(min_size=16, max_size=16) | st.binary(max_size=20)),
        span_id=draw(st.binary(min_size=8, max_size=8) | st.binary(max_size=10)),
        parent_span_id=draw(st.just(b"") | st.binary(min_size=8, max_size=8)),
        trace_state=draw(_TEXT), name=draw(_TEXT), kind=draw(st.integers(0, 5)),
        start_time_unix_nano=draw(_TIME), end_time_unix_nano=draw(_TIME),
        dropped_attributes_count=draw(st.integers(0, 9)), dropped_events_count=draw(st.integers(0, 9)),
        dropped_links_count=draw(st.integers(0, 9)),
        status=Status(code=draw(st.integers(0, 2)), message=draw(_TEXT)),
    )
    s.attributes.extend(KeyValue(key=k, value=v) for k, v in draw(_ATTRS))
    for name, attrs in draw(st.lists(st.tuples(_TEXT, _ATTRS), max_size=2)):
        ev = s.events.add(name=name, time_unix_nano=draw(_TIME))
        ev.attributes.extend(KeyValue(key=k, value=v) for k, v in attrs)
    for _ in range(draw(st.integers(0, 2))):
        ln = s.links.add(trace_id=draw(st.binary(min_size=16, max_size=16)),
                         span_id=draw(st.binary(min_size=8, max_size=8)), trace_state=draw(_TEXT))
        ln.attributes.extend(KeyValue(key=k, value=v) for k, v in draw(_ATTRS))
    return s


@st.composite
def otlp_requests(draw: st.DrawFn) -> ExportTraceServiceRequest:
    """A random request of 0-3 resources x 0-2 scopes x 0-4 spans."""
    req = ExportTraceServiceRequest()
    for _ in range(draw(st.integers(0, 3))):
        rs = req.resource_spans.add()
        rs.resource.attributes.extend(KeyValue(key=k, value=v) for k, v in draw(_ATTRS))
        if draw(st.booleans()):
            rs.resource.attributes.add(key="service.name", value=AnyValue(string_value=draw(_TEXT)))
        for _ in range(draw(st.integers(0, 2))):
            ss = rs.scope_spans.add()
            ss.scope.name, ss.scope.version = draw(_TEXT), draw(_TEXT)
            ss.spans.extend(draw(st.lists(spans(), max_size=4)))
    return req


def _same(reqs: list[tuple[ExportTraceServiceRequest, int]]) -> None:
    ref = convert_reference(reqs, "b1")
    wire = convert_wire([(r.SerializeToString(), recv) for r, recv in reqs], "b1")
    for fast in (convert_fast(reqs, "b1"), wire):
        assert fast.table.schema.equals(ref.table.schema, check_metadata=True)
        assert fast.table.to_pylist() == ref.table.to_pylist()
        assert fast.keys.tolist() == ref.keys.tolist()
        assert fast.content.tolist() == ref.content.tolist()


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(otlp_requests(), min_size=1, max_size=3))
def test_fast_equals_reference_on_random_requests(reqs: list[ExportTraceServiceRequest]) -> None:
    _same([(r, 1_700_000_000_000_000_000 + i) for i, r in enumerate(reqs)])


def test_fast_equals_reference_on_generated_agent_traces() -> None:
    reqs = list(requests(3000, seed=11))
    _same([(r, time.time_ns()) for r in reqs])


def test_parallel_conversion_equals_one_process() -> None:
    records = [(r.SerializeToString(), 1_000 + i) for i, r in enumerate(requests(2500, seed=4))]
    one, two = convert_records(records, "b"), convert_parallel(records, "b", 2)
    rows = sorted(zip(one.table.to_pylist(), one.keys.tolist(), one.content.tolist(), strict=True), key=repr)
    assert sorted(zip(two.table.to_pylist(), two.keys.tolist(), two.content.tolist(), strict=True), key=repr) == rows


def test_undecodable_payload_is_counted_not_converted() -> None:
    good = next(iter(requests(10, seed=1)))
    conv = convert_records([(b"\xff\xff\xff", 1), (good.SerializeToString(), 2)], "b")
    assert conv.bad_records == 1
    assert conv.table.num_rows == sum(len(ss.spans) for rs in good.resource_spans for ss in rs.scope_spans)


def _back_to_otlp(path: Path) -> ExportTraceServiceRequest:
    """Rebuild spans from the stored rows (attributes in their text form)."""
    req = ExportTraceServiceRequest()
    for row in pq.read_table(path).to_pylist():
        rs = req.resource_spans.add()
        rs.resource.attributes.extend(KeyValue(key=k, value=AnyValue(string_value=v))
                                      for k, v in row["resource_attributes"])
        s = rs.scope_spans.add().spans.add(
            trace_id=bytes.fromhex(row["trace_id"]), span_id=bytes.fromhex(row["span_id"]),
            parent_span_id=bytes.fromhex(row["parent_span_id"] or ""), trace_state=row["trace_state"] or "",
            name=row["name"], kind=row["kind"], start_time_unix_nano=row["start_time_unix_nano"],
            end_time_unix_nano=row["end_time_unix_nano"],
            status=Status(code=row["status_code"], message=row["status_message"] or ""),
        )
        s.attributes.extend(KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in row["attributes"])
    return req


def _canonical(req: ExportTraceServiceRequest) -> list[tuple[object, ...]]:
    out = []
    for rs in req.resource_spans:
        res = {kv.key: any_value_text(kv.value) for kv in rs.resource.attributes}
        for ss in rs.scope_spans:
            for s in ss.spans:
                attrs = {kv.key: any_value_text(kv.value) for kv in s.attributes}
                out.append((s.trace_id, s.span_id, s.parent_span_id, s.trace_state, s.name, s.kind,
                            s.start_time_unix_nano, s.end_time_unix_nano, s.status.code, s.status.message,
                            sorted(attrs.items()), sorted(res.items())))
    return sorted(out, key=repr)


@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(otlp_requests())
def test_otlp_parquet_otlp_round_trip(tmp_path: Path, req: ExportTraceServiceRequest) -> None:
    for rs in req.resource_spans:  # ids valid, as the collector guarantees before the spool
        for ss in rs.scope_spans:
            for s in ss.spans:
                s.trace_id, s.span_id = (s.trace_id + bytes(16))[:16], (s.span_id + bytes(8))[:8]
                del s.links[:]
    conv = convert_records([(req.SerializeToString(), 5)], "rt")
    path = write_atomic(conv.table, tmp_path / f"rt-{time.time_ns()}.parquet")
    assert _canonical(_back_to_otlp(path)) == _canonical(req)


def test_invalid_utf8_in_an_attribute_falls_back_and_skips_only_that_payload() -> None:
    reqs = list(requests(1024, seed=6))
    bad = reqs[0].SerializeToString().replace(b"api.example.com", b"\xffpi.example.com", 1)
    assert bad != reqs[0].SerializeToString()
    conv = convert_records([(bad, 1), (reqs[1].SerializeToString(), 2)], "b")
    assert conv.bad_records == 1
    assert conv.table.to_pylist() == convert_reference([(reqs[1], 2)], "b").table.to_pylist()
