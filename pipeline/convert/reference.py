"""The straightforward protobuf-object loop: the oracle the fast decoders are tested against."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa
import xxhash
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tracedag.pipeline.convert.converted import Converted
from tracedag.pipeline.convert.values import attributes_text
from tracedag.pipeline.normalize.spans import normalize
from tracedag.pipeline.store.dedupe import keys_from_hex
from tracedag.schemas.spans import BASE_SCHEMA


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
