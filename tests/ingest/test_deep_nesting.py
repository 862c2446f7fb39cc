"""Deeply nested attribute values the collector acknowledges are converted and stored (not dropped)."""

from __future__ import annotations

import http.client
import json
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from tracedag.pipeline.service import CollectorConfig, start_collector
from tracedag.pipeline.store.views import connect

DEPTH = 64


def _nest_kvlist(v: AnyValue, depth: int) -> None:
    for _ in range(depth):
        kv = v.kvlist_value.values.add()
        kv.key = "k"
        v = kv.value
    v.string_value = "leaf"


def _nest_array(v: AnyValue, depth: int) -> None:
    for _ in range(depth):
        v = v.array_value.values.add()
    v.int_value = 7


def _deep_request() -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.add(key="service.name").value.string_value = "deep-svc"
    span = rs.scope_spans.add().spans.add(
        trace_id=bytes(range(1, 17)), span_id=bytes(range(1, 9)), name="deep", start_time_unix_nano=10,
        end_time_unix_nano=20,
    )
    span.attributes.add(key="plain").value.string_value = "v"
    _nest_kvlist(span.attributes.add(key="nested.kvlist").value, DEPTH)
    _nest_array(span.attributes.add(key="nested.array").value, DEPTH)
    event = span.events.add(name="evt", time_unix_nano=15)
    _nest_array(event.attributes.add(key="nested.event").value, DEPTH)
    return req


def _depth(text: str) -> int:
    """Nesting depth of a JSON text (arrays and objects)."""
    doc, depth = json.loads(text), 0
    while isinstance(doc, (list, dict)):
        doc = doc[0] if isinstance(doc, list) else doc["k"]
        depth += 1
    return depth


def test_depth_64_attribute_acked_by_the_collector_is_stored(tmp_path: Path) -> None:
    body = _deep_request().SerializeToString()
    try:
        ExportTraceServiceRequest.FromString(body)
        upb_parses = True
    except Exception:
        upb_parses = False
    assert not upb_parses  # the case that matters: deeper than the protobuf runtime's own limit
    collector = start_collector(CollectorConfig(data=tmp_path / "data", http_port=0, grpc_port=0))
    try:
        conn = http.client.HTTPConnection("127.0.0.1", collector.http_port, timeout=30)
        conn.request("POST", "/v1/traces", body, {"Content-Type": "application/x-protobuf"})
        assert conn.getresponse().status == 200
        collector.flush()
    finally:
        collector.stop(5)
    db = connect(tmp_path / "data")
    rows = db.execute(
        "select attributes['nested.kvlist'], attributes['nested.array'], attributes['plain'],"
        " events[1].attributes['nested.event'] from spans"
    ).fetchall()
    assert len(rows) == 1
    kvlist, array, plain, event = rows[0]
    assert plain == "v"
    assert _depth(kvlist) == DEPTH and kvlist.count('"leaf"') == 1
    assert _depth(array) == DEPTH and array.endswith("7" + "]" * DEPTH)
    assert _depth(event) == DEPTH
