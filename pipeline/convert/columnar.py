"""Fast OTLP -> Arrow conversion: columns are built directly, never rows.

What makes it about 3x faster per core than ``convert.request_to_rows`` + ``from_pydict``:
- one flat Python list per column, appended inside a single loop over the spans;
- attribute maps as flat key/value lists plus offsets (``MapArray.from_arrays``), with no
  per-attribute tuple or dict (only spans with a repeated key take a slow path);
- string attribute values read directly (``AnyValue.string_value``), the oneof dispatched
  only for the rare non-string values;
- resources and scopes converted once per ``ResourceSpans``/``ScopeSpans`` and expanded with
  ``take`` (resource attributes) or dictionary indices (service, scope), not per span;
- ids hex-encoded in one call per column (16/8-byte ids joined, hexed, sliced by Arrow offsets);
- events and links (rare) built only for the spans that have them.
``WireBuilder`` goes further: it parses with a shadow schema that keeps each attribute as its
serialized bytes and decodes all of a batch's attributes at once (``wirecols``).
The output is equal, value for value, to the reference converter's (tests check this).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import xxhash
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from tracedag.pipeline.convert.values import any_value_text, attributes_text
from tracedag.pipeline.convert.wirecols import ShadowRequest, collapse_duplicates, decode_keyvalues
from tracedag.pipeline.store.dedupe import keys_from_hex, keys_from_ids
from tracedag.schemas.spans import BASE_SCHEMA, EVENT, LINK

_MAP = pa.map_(pa.string(), pa.string())


class ColumnBuilder:
    """Accumulates the ``BASE_SCHEMA`` columns of many requests.

    With ``shard=(w, k)`` only the spans of traces whose last trace-id byte is ``w`` modulo ``k``
    are kept (whole traces per shard), and ``positions`` records each kept span's index among all
    spans seen, so the shards of ``k`` workers can be put back in request order.
    """

    def __init__(self, shard: tuple[int, int] = (0, 1)) -> None:
        self.shard = shard
        self.seen = 0
        self.positions: list[int] = []
        self.n = 0
        self.trace_ids: list[bytes] = []
        self.span_ids: list[bytes] = []
        self.parents: list[bytes] = []
        self.trace_states: list[str] = []
        self.names: list[str] = []
        self.kinds: list[int] = []
        self.status_codes: list[int] = []
        self.status_msgs: list[str] = []
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.received: list[int] = []
        self.dropped: list[int] = []  # three per span
        self.attr_keys: list[str] = []
        self.attr_vals: list[str] = []
        self.attr_offsets: list[int] = [0]
        self.dup_rows: list[int] = []
        self.content: list[int] = []
        self.res_index: list[int] = []  # per span: index into the resource list
        self.scope_index: list[int] = []
        self.resources: list[list[tuple[str, str]]] = []
        self.services: list[str | None] = []
        self.scopes: list[tuple[str | None, str | None]] = []
        self.events: dict[int, list[dict[str, Any]]] = {}
        self.links: dict[int, list[dict[str, Any]]] = {}

    def add(self, request: ExportTraceServiceRequest, received: int) -> None:
        """Append every span of ``request`` (received at ``received`` unix ns)."""
        for rs in request.resource_spans:
            res_attrs, _ = attributes_text(rs.resource.attributes)
            ri = len(self.resources)
            self.resources.append(res_attrs)
            self.services.append(dict(res_attrs).get("service.name"))
            for ss in rs.scope_spans:
                si = len(self.scopes)
                self.scopes.append((ss.scope.name or None, ss.scope.version or None))
                before = self.n
                self._spans(self._mine(ss.spans) if self.shard[1] > 1 else ss.spans)
                self.add_rows(ri, si, received, self.n - before)

    def walk_scopes(self, request: Any) -> Iterator[tuple[int, int, Any]]:
        """Walk a request read with its resources and scopes left serialized: yield (resource
        index, scope index, ``ScopeSpans``) after recording each resource and scope once."""
        for rs in request.resource_spans:
            ri = self.add_resource(rs.resource)
            for ss in rs.scope_spans:
                yield ri, self.add_scope(ss.scope), ss

    def add_resource(self, raw: bytes) -> int:
        """Record a serialized ``Resource``; return its index."""
        res_attrs, _ = attributes_text(Resource.FromString(raw).attributes)
        self.resources.append(res_attrs)
        self.services.append(dict(res_attrs).get("service.name"))
        return len(self.resources) - 1

    def add_scope(self, raw: bytes) -> int:
        """Record a serialized ``InstrumentationScope``; return its index."""
        scope = InstrumentationScope.FromString(raw)
        self.scopes.append((scope.name or None, scope.version or None))
        return len(self.scopes) - 1

    def add_rows(self, resource: int, scope: int, received: int, k: int) -> None:
        """Record the resource, scope and receive time of ``k`` spans just added."""
        self.res_index.extend([resource] * k)
        self.scope_index.extend([scope] * k)
        self.received.extend([received] * k)

    def _mine(self, spans: Any) -> list[Any]:
        w, k = self.shard
        start = self.seen
        self.seen += len(spans)
        kept = [(i, sp) for i, sp in enumerate(spans, start) if (sp.trace_id[-1] if sp.trace_id else 0) % k == w]
        self.positions.extend(i for i, _ in kept)
        return [sp for _, sp in kept]

    def _add_scalars(self, span: Any) -> None:
        """Append one span's ids, name, kind, status, times, dropped counts and content hash."""
        self.trace_ids.append(span.trace_id)
        self.span_ids.append(span.span_id)
        self.parents.append(span.parent_span_id)
        self.trace_states.append(span.trace_state)
        self.names.append(span.name)
        self.kinds.append(span.kind)
        st = span.status
        self.status_codes.append(st.code)
        self.status_msgs.append(st.message)
        self.starts.append(span.start_time_unix_nano)
        self.ends.append(span.end_time_unix_nano)
        self.dropped.extend((span.dropped_attributes_count, span.dropped_events_count, span.dropped_links_count))
        self.content.append(xxhash.xxh3_64_intdigest(span.SerializeToString(deterministic=True)))

    def _spans(self, spans: Any) -> None:
        keys, vals, offs = self.attr_keys, self.attr_vals, self.attr_offsets
        scalars = self._add_scalars
        other = any_value_text  # non-string or empty string values
        n = self.n
        for span in spans:
            scalars(span)
            first = len(keys)
            for kv in span.attributes:
                keys.append(kv.key)
                v = kv.value
                vals.append(v.string_value or other(v))
            if len(keys) - first > 1 and len(set(keys[first:])) < len(keys) - first:
                self._fix_duplicates(first, n)
            offs.append(len(keys))
            if span.events:
                self.events[n] = _events(span.events)
            if span.links:
                self.links[n] = _links(span.links)
            n += 1
        self.n = n

    def _attributes(self) -> pa.Array:
        return pa.MapArray.from_arrays(
            pa.array(self.attr_offsets, pa.int32()), pa.array(self.attr_keys, pa.string()),
            pa.array(self.attr_vals, pa.string()),
        )

    def _fix_duplicates(self, first: int, row: int) -> None:
        """Collapse repeated keys of the span's attributes (last value wins, first position kept)."""
        merged: dict[str, str] = {}
        for k, v in zip(self.attr_keys[first:], self.attr_vals[first:], strict=True):
            merged[k] = v
        del self.attr_keys[first:], self.attr_vals[first:]
        self.attr_keys.extend(merged.keys())
        self.attr_vals.extend(merged.values())
        self.dup_rows.append(row)

    def finish(self, batch_id: str) -> tuple[pa.Table, np.ndarray, np.ndarray]:
        """Return the ``BASE_SCHEMA`` table, the dedupe keys and the content hashes."""
        n = self.n
        attributes = self._attributes()  # first: it finds the spans with repeated keys
        (tid, tjoined), (sid, sjoined) = _hex_column(self.trace_ids, 16), _hex_column(self.span_ids, 8)
        if tjoined is not None and sjoined is not None:
            keys = keys_from_ids(tjoined, sjoined, n)
        else:
            keys = keys_from_hex(tid, sid)
        starts = np.array(self.starts, dtype=np.uint64).astype(np.int64)
        ends = np.array(self.ends, dtype=np.uint64).astype(np.int64)
        dropped = np.array(self.dropped, dtype=np.int64).reshape(n, 3) if n else np.zeros((0, 3), np.int64)
        cols = {
            "trace_id": tid,
            "span_id": sid,
            "parent_span_id": pa.array([p.hex() if p else None for p in self.parents], pa.string()),
            "trace_state": _nullable_str(self.trace_states),
            "name": pa.array(self.names, pa.string()).dictionary_encode(),
            "service_name": _dict_take(self.services, self.res_index),
            "scope_name": _dict_take([s[0] for s in self.scopes], self.scope_index),
            "scope_version": _dict_take([s[1] for s in self.scopes], self.scope_index),
            "kind": pa.array(self.kinds, pa.int8()),
            "status_code": pa.array(self.status_codes, pa.int8()),
            "status_message": _nullable_str(self.status_msgs),
            "start_time_unix_nano": pa.array(starts),
            "end_time_unix_nano": pa.array(ends),
            "duration_ns": pa.array(ends - starts),
            "received_unix_nano": pa.array(self.received, pa.int64()),
            "batch_id": pa.array([batch_id], pa.string()).take(pa.array(np.zeros(n, np.int32))),
            "quality_flags": self._flags(starts, ends),
            "attributes": attributes,
            "resource_attributes": _resource_maps(self.resources).take(pa.array(self.res_index, pa.int32())),
            "events": _sparse(self.events, n, pa.list_(EVENT)),
            "links": _sparse(self.links, n, pa.list_(LINK)),
            "dropped_attributes_count": pa.array(dropped[:, 0].astype(np.int32)),
            "dropped_events_count": pa.array(dropped[:, 1].astype(np.int32)),
            "dropped_links_count": pa.array(dropped[:, 2].astype(np.int32)),
        }
        arrays = [_as_type(cols[f.name], f.type) for f in BASE_SCHEMA]
        table = pa.Table.from_arrays(arrays, schema=BASE_SCHEMA)
        return table, keys, np.array(self.content, dtype=np.uint64)

    def _flags(self, starts: np.ndarray, ends: np.ndarray) -> pa.Array:
        zero = starts == 0
        before = ends < starts
        dup = np.zeros(len(starts), dtype=bool)
        dup[self.dup_rows] = True
        if not (zero.any() or before.any() or dup.any()):
            return _sparse({}, self.n, pa.list_(pa.string()))
        rows: list[list[str]] = []
        for z, b, d in zip(zero.tolist(), before.tolist(), dup.tolist(), strict=True):
            rows.append([f for f, on in (("zero_start", z), ("end_before_start", b),
                                         ("duplicate_attribute_key", d)) if on])
        return pa.array(rows, pa.list_(pa.string()))


def _as_type(arr: pa.Array, typ: pa.DataType) -> pa.Array:
    return arr if arr.type == typ else arr.cast(typ)


def _hex_column(ids: list[bytes], width: int) -> tuple[pa.Array, bytes | None]:
    """Hex-encode ids in one call when all have ``width`` bytes (also returning them joined), else one by one."""
    n = len(ids)
    joined = b"".join(ids)
    if len(joined) != width * n or not (np.fromiter(map(len, ids), dtype=np.int64, count=n) == width).all():
        return pa.array([x.hex() for x in ids], pa.string()), None
    offsets = pa.py_buffer(np.arange(0, 2 * width * (n + 1), 2 * width, dtype=np.int32))
    return pa.StringArray.from_buffers(n, offsets, pa.py_buffer(joined.hex().encode("ascii"))), joined


def _nullable_str(values: list[str]) -> pa.Array:
    arr = pa.array(values, pa.string())
    if not any(values):
        return pa.nulls(len(values), pa.string())
    return pa.compute.if_else(pa.compute.equal(arr, ""), pa.scalar(None, pa.string()), arr)


def _dict_take(values: list[str | None], index: list[int]) -> pa.Array:
    """A dictionary column of ``values[index[i]]`` (nulls kept)."""
    return pa.array(values, pa.string()).take(pa.array(index, pa.int32())).dictionary_encode()


def _resource_maps(resources: list[list[tuple[str, str]]]) -> pa.Array:
    return pa.array(resources, _MAP)


def _sparse(items: dict[int, list[Any]], n: int, typ: pa.DataType) -> pa.Array:
    """A list column that is empty except at the rows in ``items`` (built from offsets, no per-row lists)."""
    counts = np.zeros(n, dtype=np.int32)
    rows = sorted(items)
    counts[rows] = [len(items[r]) for r in rows]
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    values = pa.array([v for r in rows for v in items[r]], typ.value_type)
    return pa.ListArray.from_arrays(pa.array(offsets), values, type=typ)


def _events(events: Any) -> list[dict[str, Any]]:
    return [{"time_unix_nano": e.time_unix_nano, "name": e.name, "attributes": attributes_text(e.attributes)[0]}
            for e in events]


def _links(links: Any) -> list[dict[str, Any]]:
    return [{"trace_id": ln.trace_id.hex(), "span_id": ln.span_id.hex(), "trace_state": ln.trace_state or None,
             "attributes": attributes_text(ln.attributes)[0]} for ln in links]



class WireBuilder(ColumnBuilder):
    """``ColumnBuilder`` over serialized requests: attributes stay bytes until one vectorized decode."""

    def __init__(self, shard: tuple[int, int] = (0, 1)) -> None:
        super().__init__(shard)
        self.raw_attrs: list[bytes] = []
        self.attr_counts: list[int] = []

    def add_payload(self, payload: bytes, received: int) -> None:
        """Append every span of a serialized ``ExportTraceServiceRequest``."""
        for ri, si, ss in self.walk_scopes(ShadowRequest.FromString(payload)):
            before = self.n
            self._spans(self._mine(ss.spans) if self.shard[1] > 1 else ss.spans)
            self.add_rows(ri, si, received, self.n - before)

    def _spans(self, spans: Any) -> None:
        raw, counts = self.raw_attrs, self.attr_counts
        scalars = self._add_scalars
        n = self.n
        for span in spans:
            scalars(span)
            attrs = span.attributes
            raw.extend(attrs)
            counts.append(len(attrs))
            if span.events:
                self.events[n] = _events(Span.Event.FromString(b) for b in span.events)
            if span.links:
                self.links[n] = _links(Span.Link.FromString(b) for b in span.links)
            n += 1
        self.n = n

    def _attributes(self) -> pa.Array:
        keys, vals = decode_keyvalues(self.raw_attrs)
        counts = np.array(self.attr_counts, dtype=np.int64)
        keys, vals, counts, self.dup_rows = collapse_duplicates(keys, vals, counts)
        offsets = np.zeros(len(counts) + 1, dtype=np.int32)
        np.cumsum(counts, out=offsets[1:])
        return pa.MapArray.from_arrays(pa.array(offsets), keys, vals)
