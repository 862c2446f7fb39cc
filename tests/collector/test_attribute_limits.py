"""B22 huge attribute: ``max_attribute_bytes`` truncation (HTTP and gRPC) and whole values by default."""

from __future__ import annotations

import hashlib

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from tests.collector.collector_support import PB, make_request, make_span, post
from tracedag.collector.admission import TRUNCATED
from tracedag.pipeline.service import CollectorConfig, start_collector
from tracedag.pipeline.store.views import connect

MiB = 1024 * 1024
LIMIT = 20 * MiB
KEY = "gen_ai.input.messages"
EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
_PREFIX = '[{"role":"user","parts":[{"type":"text","content":"'
_SUFFIX = '"}]}]'


def messages(total_bytes: int, split_char_at: int | None = None) -> str:
    """A GenAI messages JSON of ``total_bytes`` UTF-8 bytes; a 3-byte character may start at ``split_char_at``."""
    if split_char_at is None:
        return _PREFIX + "x" * (total_bytes - len(_PREFIX) - len(_SUFFIX)) + _SUFFIX
    head = _PREFIX + "x" * (split_char_at - len(_PREFIX))
    return head + "\u20ac" + "y" * (total_bytes - split_char_at - 3 - len(_SUFFIX)) + _SUFFIX


def _digest(text: str) -> str:
    """Compare 20 MiB strings by length and hash (readable assertion messages)."""
    return f"{len(text)}:{hashlib.sha256(text.encode()).hexdigest()}"


def _span(i: int, value: str):
    span = make_span(i, name=f"huge-{i}")
    kv = span.attributes.add()
    kv.key, kv.value.string_value = KEY, value
    return span


def _stored_values(data) -> dict[str, str]:
    con = connect(data)
    rows = con.execute(f"select name, attributes['{KEY}'] from spans").fetchall()
    return {name: value for name, value in rows}


def _send(c, transport: str, body: bytes) -> ExportTraceServiceResponse:
    if transport == "http":
        r = post(c.http_port, body, PB, timeout=60)
        assert r.status == 200, r.body[:300]
        return ExportTraceServiceResponse.FromString(r.body)
    options = [("grpc.max_send_message_length", -1)]
    with grpc.insecure_channel(f"127.0.0.1:{c.grpc_port}", options=options) as ch:
        raw = ch.unary_unary(EXPORT)(body, timeout=60)
    return ExportTraceServiceResponse.FromString(raw)


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_b22_value_over_max_attribute_bytes_truncated_with_warning(tmp_path, transport):
    at_limit = messages(LIMIT)
    over = messages(LIMIT + 7, split_char_at=LIMIT - 1)  # the euro sign straddles the limit
    assert len(at_limit.encode()) == LIMIT and len(over.encode()) == LIMIT + 7
    c = start_collector(CollectorConfig(data=tmp_path / "data", http_port=0, grpc_port=0, max_attribute_bytes=LIMIT))
    try:
        before = TRUNCATED.value()
        body = make_request([_span(0, at_limit), _span(1, over)]).SerializeToString()
        resp = _send(c, transport, body)
        assert resp.HasField("partial_success")
        assert resp.partial_success.rejected_spans == 0
        message = resp.partial_success.error_message
        assert KEY in message and str(LIMIT) in message and "truncated" in message
        assert TRUNCATED.value() == before + 1
        c.flush()
        values = _stored_values(c.data)
    finally:
        c.stop(2)
    assert _digest(values["huge-0"]) == _digest(at_limit)  # exactly at the limit: whole
    cut = values["huge-1"]
    assert len(cut.encode()) == LIMIT - 1  # the split character dropped, valid UTF-8
    assert _digest(cut) == _digest(over[: len(cut)]) and cut.endswith("x")


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_b22_default_keeps_a_20_mib_attribute_whole(collector, transport):
    value = messages(LIMIT + 7, split_char_at=LIMIT - 1)
    resp = _send(collector, transport, make_request([_span(2, value)]).SerializeToString())
    assert not resp.HasField("partial_success")
    collector.flush()
    assert _digest(_stored_values(collector.data)["huge-2"]) == _digest(value)
