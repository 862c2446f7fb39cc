"""RELIABILITY.md A31/A33 on the fast converter: odd spans are stored, flagged, never rejected.

Repeated attribute keys within a span keep the last value at the first key's position and flag
``duplicate_attribute_key``; ``end < start`` and a zero start are flagged. The fast (wire) path
must give exactly what the reference row-by-row converter gives.
"""

from __future__ import annotations

import numpy as np
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from tracedag.pipeline.convert.records import convert_records
from tracedag.pipeline.convert.reference import requests_to_table
from tracedag.pipeline.convert.wirecols import _has_repeats

RECEIVED = 1_700_000_000_000_000_000


def _kv(key: str, value: str | int) -> KeyValue:
    kv = KeyValue(key=key)
    if isinstance(value, int):
        kv.value.int_value = value
    else:
        kv.value.string_value = value
    return kv


def _span(i: int, attrs: list[tuple[str, str | int]], start: int = 10, end: int = 20) -> Span:
    span = Span(trace_id=(i + 1).to_bytes(16, "big"), span_id=(i + 1).to_bytes(8, "big"), name=f"s{i}",
                start_time_unix_nano=start, end_time_unix_nano=end)
    span.attributes.extend(_kv(k, v) for k, v in attrs)
    return span


def _request(spans: list[Span]) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    req.resource_spans.add().scope_spans.add().spans.extend(spans)
    return req


def _both(req: ExportTraceServiceRequest) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    cols = ["span_id", "attributes", "quality_flags"]
    fast = convert_records([(req.SerializeToString(), RECEIVED)], "b").table.select(cols).to_pylist()
    ref = requests_to_table([(req, RECEIVED, "b")]).select(cols).to_pylist()
    return fast, ref


def test_repeated_keys_last_value_first_position_and_flagged():
    req = _request([
        _span(0, [("k", "first"), ("x", 2), ("k", "last")]),
        _span(1, [("k", "only"), ("y", "z")]),
    ])
    fast, ref = _both(req)
    assert fast == ref
    assert fast[0]["attributes"] == [("k", "last"), ("x", "2")]
    assert fast[0]["quality_flags"] == ["duplicate_attribute_key"]
    assert fast[1]["attributes"] == [("k", "only"), ("y", "z")]
    assert fast[1]["quality_flags"] == []


def test_odd_timestamps_are_flagged_not_rejected():
    req = _request([_span(0, [("a", 1)], start=0, end=5), _span(1, [("a", 1)], start=50, end=40),
                    _span(2, [("a", 1)], start=0, end=0)])
    fast, ref = _both(req)
    assert fast == ref
    assert [r["quality_flags"] for r in fast] == [["zero_start"], ["end_before_start"], ["zero_start"]]


def test_many_spans_with_one_repeat_among_thousands_of_keys():
    spans = [_span(i, [(f"key.{i % 97}.{j}", j) for j in range(20)]) for i in range(400)]
    spans[237].attributes.append(_kv("key.43.3", "again"))  # 237 % 97 == 43
    fast, ref = _both(_request(spans))
    assert fast == ref
    flagged = [i for i, r in enumerate(fast) if r["quality_flags"]]
    assert flagged == [237]
    assert dict(fast[237]["attributes"])["key.43.3"] == "again"


@pytest.mark.parametrize("spread", [1, 10**12])  # counting pass, and the sort for a huge range
def test_has_repeats_both_paths(spread):
    distinct = np.arange(1000, dtype=np.int64) * spread
    assert not _has_repeats(distinct)
    assert _has_repeats(np.append(distinct, distinct[500]))
    assert not _has_repeats(np.zeros(0, dtype=np.int64))
