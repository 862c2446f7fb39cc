"""OTLP ``ExportTraceServiceRequest`` -> Arrow ``spans`` rows (base columns), then normalization.

Attribute values are stored as text (``attributes`` is ``map<string, string>``): strings as
they are, booleans as ``true``/``false``, numbers in their decimal form, bytes as base64 (as in
OTLP/JSON), arrays and key-value lists as JSON.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import xxhash
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from tracedag.collector.wire import parse_request
from tracedag.pipeline.dedupe import keys_from_hex
from tracedag.pipeline.normalize import normalize
from tracedag.schemas.spans import BASE_SCHEMA

logger = logging.getLogger(__name__)


def any_value_text(v: AnyValue) -> str:
    """Return the text form of an OTLP ``AnyValue``."""
    which = v.WhichOneof("value")
    if which == "string_value":
        return v.string_value
    if which is None:
        return ""
    if which in ("array_value", "kvlist_value"):
        return json.dumps(_any_value_json(v), ensure_ascii=False, separators=(",", ":"))
    return str(_any_value_json(v))


def _any_value_json(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which == "string_value":
        return v.string_value
    if which == "bool_value":
        return "true" if v.bool_value else "false"
    if which == "int_value":
        return v.int_value
    if which == "double_value":
        return v.double_value
    if which == "bytes_value":
        return base64.b64encode(v.bytes_value).decode("ascii")
    if which == "array_value":
        return [_any_value_json(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _any_value_json(kv.value) for kv in v.kvlist_value.values}
    return None


def attributes_text(attrs: Iterable[KeyValue]) -> tuple[list[tuple[str, str]], bool]:
    """Return the attributes as (key, text) pairs, last duplicate winning, and whether keys repeated."""
    out: dict[str, str] = {}
    dup = False
    for kv in attrs:
        if kv.key in out:
            dup = True
        out[kv.key] = any_value_text(kv.value)
    return list(out.items()), dup


def request_to_rows(
    request: ExportTraceServiceRequest, received_unix_nano: int, batch_id: str
) -> dict[str, list[Any]]:
    """Flatten one request into column lists of ``BASE_SCHEMA`` (straightforward reference version)."""
    cols: dict[str, list[Any]] = {f.name: [] for f in BASE_SCHEMA}
    for rs in request.resource_spans:
        res_attrs, _ = attributes_text(rs.resource.attributes)
        service = dict(res_attrs).get("service.name")
        for ss in rs.scope_spans:
            for span in ss.spans:
                attrs, dup = attributes_text(span.attributes)
                flags = _quality_flags(span.start_time_unix_nano, span.end_time_unix_nano, dup)
                row = {
                    "trace_id": span.trace_id.hex(),
                    "span_id": span.span_id.hex(),
                    "parent_span_id": span.parent_span_id.hex() or None,
                    "trace_state": span.trace_state or None,
                    "name": span.name,
                    "service_name": service,
                    "scope_name": ss.scope.name or None,
                    "scope_version": ss.scope.version or None,
                    "kind": span.kind,
                    "status_code": span.status.code,
                    "status_message": span.status.message or None,
                    "start_time_unix_nano": span.start_time_unix_nano,
                    "end_time_unix_nano": span.end_time_unix_nano,
                    "duration_ns": span.end_time_unix_nano - span.start_time_unix_nano,
                    "received_unix_nano": received_unix_nano,
                    "batch_id": batch_id,
                    "quality_flags": flags,
                    "attributes": attrs,
                    "resource_attributes": res_attrs,
                    "events": [
                        {
                            "time_unix_nano": e.time_unix_nano,
                            "name": e.name,
                            "attributes": attributes_text(e.attributes)[0],
                        }
                        for e in span.events
                    ],
                    "links": [
                        {
                            "trace_id": ln.trace_id.hex(),
                            "span_id": ln.span_id.hex(),
                            "trace_state": ln.trace_state or None,
                            "attributes": attributes_text(ln.attributes)[0],
                        }
                        for ln in span.links
                    ],
                    "dropped_attributes_count": span.dropped_attributes_count,
                    "dropped_events_count": span.dropped_events_count,
                    "dropped_links_count": span.dropped_links_count,
                }
                for k, v in row.items():
                    cols[k].append(v)
    return cols


def _quality_flags(start: int, end: int, duplicate_keys: bool) -> list[str]:
    flags = []
    if start == 0:
        flags.append("zero_start")
    if end < start:
        flags.append("end_before_start")
    if duplicate_keys:
        flags.append("duplicate_attribute_key")
    return flags


def requests_to_table(
    requests: Iterable[tuple[ExportTraceServiceRequest, int, str]],
) -> pa.Table:
    """Convert (request, received_unix_nano, batch_id) triples into one normalized ``spans`` table."""
    cols: dict[str, list[Any]] = {f.name: [] for f in BASE_SCHEMA}
    for request, received, batch_id in requests:
        for k, v in request_to_rows(request, received, batch_id).items():
            cols[k].extend(v)
    base = pa.Table.from_pydict(cols, schema=BASE_SCHEMA)
    return normalize(base)


@dataclass
class Converted:
    """Spans of a batch: the normalized ``SPANS_V1`` table plus each row's dedupe key and content hash."""

    table: pa.Table
    keys: np.ndarray
    content: np.ndarray
    bad_records: int = 0  # payloads that did not parse
    positions: np.ndarray | None = None  # row -> index among all spans of the batch (sharded only)


def content_hashes(request: ExportTraceServiceRequest) -> list[int]:
    """Return the 64-bit hash of each span's serialized protobuf, in row order."""
    return [
        xxhash.xxh3_64_intdigest(span.SerializeToString(deterministic=True))
        for rs in request.resource_spans
        for ss in rs.scope_spans
        for span in ss.spans
    ]


def convert_reference(records: Iterable[tuple[ExportTraceServiceRequest, int]], batch_id: str) -> Converted:
    """Convert (request, received) pairs with the straightforward loop (the oracle of the fast path)."""
    reqs = list(records)
    table = requests_to_table((r, recv, batch_id) for r, recv in reqs)
    content = np.array([h for r, _ in reqs for h in content_hashes(r)], dtype=np.uint64)
    keys = keys_from_hex(table.column("trace_id"), table.column("span_id"))
    return Converted(table, keys, content)


def convert_records(
    records: list[tuple[bytes, int]], batch_id: str, workers: int = 1, shard: tuple[int, int] = (0, 1),
    *, consume: bool = False,
) -> Converted:
    """Convert serialized requests with their receive times into one ``Converted`` batch.

    The wire path (``columnar.WireBuilder``) is tried first; if any payload does not parse or holds
    invalid UTF-8, the batch is converted record by record instead, skipping the payloads that do
    not parse (counted in ``bad_records``). With ``workers > 1`` each worker process converts the
    whole traces of one shard (``shard=(w, k)``: traces whose last id byte is ``w`` mod ``k``), so
    normalization sees the same traces as in one process. With ``consume``, ``records`` is emptied
    once its spans are decoded, so the payloads are freed before normalization (the converter's
    peak memory).
    """
    if workers > 1 and len(records) > 1:
        from tracedag.pipeline.convert_pool import convert_parallel

        parallel: Converted = convert_parallel(records, batch_id, workers)
        return parallel
    try:
        conv = _wire_base(records, batch_id, shard)
    except (DecodeError, pa.ArrowInvalid, ValueError, IndexError) as exc:
        logger.info("batch %s: converting record by record (%s)", batch_id, exc)
        conv = _record_by_record(records, batch_id, shard)
    if consume:
        records.clear()
    conv.table = normalize(conv.table)
    return conv


def _record_by_record(records: list[tuple[bytes, int]], batch_id: str, shard: tuple[int, int]) -> Converted:
    """Base columns of the payloads that parse, one request at a time; the others counted in ``bad_records``."""
    good: list[tuple[ExportTraceServiceRequest, int]] = []
    bad = 0
    for payload, received in records:
        try:
            good.append((parse_request(payload), received))
        except DecodeError:
            bad += 1
    conv = _fast_base(good, batch_id, shard)
    conv.bad_records = bad
    return conv


def convert_wire(records: list[tuple[bytes, int]], batch_id: str, shard: tuple[int, int] = (0, 1)) -> Converted:
    """Convert serialized requests from the wire: spans decoded in lockstep (``wirespans``), else
    one by one with their attributes decoded for the whole batch (``columnar.WireBuilder``)."""
    conv = _wire_base(records, batch_id, shard)
    conv.table = normalize(conv.table)
    return conv


def _wire_base(records: list[tuple[bytes, int]], batch_id: str, shard: tuple[int, int]) -> Converted:
    """``convert_wire`` without normalization (``BASE_SCHEMA`` columns)."""
    from tracedag.pipeline.columnar import WireBuilder

    if shard == (0, 1):
        from tracedag.pipeline.wirespans import SpanBuilder, Unusual

        try:
            return _base_with(SpanBuilder(), records, batch_id)
        except Unusual as exc:
            logger.info("batch %s: spans decoded one by one (%s)", batch_id, exc)
    return _base_with(WireBuilder(shard), records, batch_id)


def _base_with(builder: Any, records: list[tuple[bytes, int]], batch_id: str) -> Converted:
    for payload, received in records:
        builder.add_payload(payload, received)
    base, keys, content = builder.finish(batch_id)
    return Converted(base, keys, content, positions=np.array(builder.positions, dtype=np.int64))


def convert_fast(
    records: Iterable[tuple[ExportTraceServiceRequest, int]], batch_id: str, shard: tuple[int, int] = (0, 1)
) -> Converted:
    """Convert (request, received) pairs with the columnar builder; equal to ``convert_reference``."""
    conv = _fast_base(records, batch_id, shard)
    conv.table = normalize(conv.table)
    return conv


def _fast_base(
    records: Iterable[tuple[ExportTraceServiceRequest, int]], batch_id: str, shard: tuple[int, int]
) -> Converted:
    """``convert_fast`` without normalization."""
    from tracedag.pipeline.columnar import ColumnBuilder

    builder = ColumnBuilder(shard)
    for request, received in records:
        builder.add(request, received)
    base, keys, content = builder.finish(batch_id)
    return Converted(base, keys, content, positions=np.array(builder.positions, dtype=np.int64))
