"""Spans decoded straight from the protobuf wire format, all spans of a batch at once.

``WireBuilder`` still walks the spans in Python (one upb message per span, a dozen attribute
reads each). ``SpanBuilder`` parses the requests with a shadow schema that keeps every span as
its serialized bytes, joins them into one buffer and decodes them *in lockstep* with numpy: at
each step every span still being read has its next field's tag, varint or length read as a
vector, and the field is routed by number. Repeated fields (attributes, events, links) come out
as byte ranges of the same buffer, so the attribute records are decoded by ``wirecols`` without
one Python object per attribute. Strings become Arrow ``string_view`` arrays over the buffer
(UTF-8 checked). Anything unexpected (a wire type that does not match the field, a repeated
``status``, a truncated field, ids of unusual lengths) raises ``Unusual``: the caller then uses
the per-span path, so the output is always the reference converter's.
The content hash of a span is the xxh3 of its bytes as received (upb re-serializes canonical
encodings to the same bytes, so the other builders agree on what the SDKs send).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from tracedag.pipeline.convert.columnar import (
    ColumnBuilder,
    _as_type,
    _dict_take,
    _events,
    _hex_column,
    _links,
    _resource_maps,
    _sparse,
)
from tracedag.pipeline.convert.wirecols import _message, _varint, collapse_duplicates, decode_ranges
from tracedag.pipeline.normalize.byteranges import heads_of, strings_at
from tracedag.pipeline.store.dedupe import keys_from_hex, keys_from_ids
from tracedag.schemas.spans import BASE_SCHEMA, EVENT, LINK

_B, _MSG, _S = 12, 11, 9
_REPEATED, _OPTIONAL = 3, 1
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5

# Span fields: number -> wire type (OTLP trace.proto)
SPAN_FIELDS = {1: _LEN, 2: _LEN, 3: _LEN, 4: _LEN, 5: _LEN, 6: _VARINT, 7: _I64, 8: _I64, 9: _LEN, 10: _VARINT,
               11: _LEN, 12: _VARINT, 13: _LEN, 14: _VARINT, 15: _LEN, 16: _I32}
STATUS_FIELDS = {2: _LEN, 3: _VARINT}


MAX_STEPS = 1024
"""Lockstep steps (fields of the widest span) before the batch goes to the per-span path."""


class Unusual(ValueError):
    """The spans hold something the vectorized decoder leaves to the per-span path."""


def _raw_request_class() -> Any:
    fp = descriptor_pb2.FileDescriptorProto(name="tracedag_shadow_raw.proto", package="tracedag.raw", syntax="proto3")
    o, r = _OPTIONAL, _REPEATED
    _message(fp, "ScopeSpans", [("scope", 1, _B, o, ""), ("spans", 2, _B, r, ""), ("schema_url", 3, _S, o, "")])
    _message(fp, "ResourceSpans", [("resource", 1, _B, o, ""), ("scope_spans", 2, _MSG, r, ".tracedag.raw.ScopeSpans"),
                                   ("schema_url", 3, _S, o, "")])
    _message(fp, "Request", [("resource_spans", 1, _MSG, r, ".tracedag.raw.ResourceSpans")])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tracedag.raw.Request"))


RawRequest: Any = _raw_request_class()


@dataclass
class Fields:
    """What ``walk`` found per field number, in encounter order: (row, value or start, length)."""

    rows: dict[int, list[np.ndarray]] = field(default_factory=dict)
    vals: dict[int, list[np.ndarray]] = field(default_factory=dict)
    lens: dict[int, list[np.ndarray]] = field(default_factory=dict)

    def add(self, number: int, rows: np.ndarray, vals: np.ndarray, lens: np.ndarray) -> None:
        """Record occurrences of field ``number``."""
        self.rows.setdefault(number, []).append(rows)
        self.vals.setdefault(number, []).append(vals)
        self.lens.setdefault(number, []).append(lens)

    def all(self, number: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every occurrence of ``number``: rows, values/starts, lengths (in encounter order)."""
        if number not in self.rows:
            empty = np.zeros(0, dtype=np.int64)
            return empty, np.zeros(0, dtype=np.uint64), empty
        return (np.concatenate(self.rows[number]), np.concatenate(self.vals[number]),
                np.concatenate(self.lens[number]))

    def last(self, number: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per row: present, value/start and length of the last occurrence of a singular field."""
        rows, vals, lens = self.all(number)
        present = np.zeros(n, dtype=bool)
        value = np.zeros(n, dtype=np.uint64)
        length = np.zeros(n, dtype=np.int64)
        present[rows], value[rows], length[rows] = True, vals, lens  # later occurrences overwrite
        return present, value, length


_BASE_SIZE = np.array([0, 8, 0, -1, -1, 4, -1, -1])
"""Bytes a field's value takes past its varint, per wire type (-1: groups, not in OTLP)."""


def walk(buf: np.ndarray, start: np.ndarray, end: np.ndarray, wanted: dict[int, int]) -> Fields:
    """Read the messages ``buf[start[i]:end[i]]`` field by field, all rows at each step.

    ``wanted`` maps field numbers (at most 16) to their wire types; other fields are skipped. LEN
    fields give (start, length) of their content, VARINT the value, I64/I32 the offset of their
    bytes. Each step only reads one field of every row; the fields are grouped by number once,
    after the last step (a step costs a fixed number of numpy calls, whatever the fields).
    """
    table = np.array([wanted.get(k, -1) for k in range(18)])  # 17: any larger number
    pos = start.copy()
    active = np.flatnonzero(pos < end)
    seen: list[tuple[np.ndarray, ...]] = []
    while len(active):
        if len(seen) >= MAX_STEPS:  # a very wide span: a step per field would be slow, upb is not
            raise Unusual(f"a span with more than {MAX_STEPS} fields")
        p, stop = pos[active], end[active]
        number, wire, p = _tags(buf, p)
        val, vn, vok = _varint(buf, p, 10)
        is_len = wire == _LEN
        length = np.where(is_len, val, np.uint64(0))
        if (length > np.uint64(1 << 31)).any():
            raise Unusual("malformed or unexpected field in a span")
        base = _BASE_SIZE[wire]
        nxt = p + base + np.where((wire & 5) == 0, vn, 0) + length.astype(np.int64)
        expected = table[np.minimum(number, 17)]
        bad = (base < 0) | (number == 0) | (nxt > stop) | (~vok & ((wire & 5) == 0))
        if (bad | ((expected >= 0) & (expected != wire))).any():
            raise Unusual("malformed or unexpected field in a span")
        seen.append((active, number, p, vn, val))
        pos[active] = nxt
        active = active[nxt < stop]
    return _grouped(seen, wanted, table)


def _tags(buf: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Field number, wire type and the position after the tag, at each position."""
    b = buf[p]
    if (b < 0x80).all():  # one-byte tags: fields 1-15
        tag, after = b.astype(np.int64), p + 1
    else:
        raw, tn, ok = _varint(buf, p, 5)
        if not ok.all():
            raise Unusual("malformed or unexpected field in a span")
        tag, after = raw.astype(np.int64), p + tn
    return tag >> 3, tag & 7, after


def _grouped(seen: list[tuple[np.ndarray, ...]], wanted: dict[int, int], table: np.ndarray) -> Fields:
    """The fields ``walk`` read, grouped by number (encounter order kept within a number)."""
    out = Fields()
    if not seen:
        return out
    rows, number, p, vn, val = (np.concatenate(parts) for parts in zip(*seen, strict=True))
    keep = np.flatnonzero(table[np.minimum(number, 17)] >= 0)
    if not len(keep):
        return out
    keep = keep[np.argsort(number[keep], kind="stable")]
    numbers = number[keep]
    bounds = np.flatnonzero(np.diff(numbers)) + 1
    for group in np.split(keep, bounds):
        k = int(number[group[0]])
        if wanted[k] == _LEN:
            out.add(k, rows[group], (p[group] + vn[group]).astype(np.uint64), val[group].astype(np.int64))
        elif wanted[k] == _VARINT:
            out.add(k, rows[group], val[group], np.zeros(len(group), dtype=np.int64))
        else:
            out.add(k, rows[group], p[group].astype(np.uint64), np.zeros(len(group), dtype=np.int64))
    return out


class SpanBuilder(ColumnBuilder):
    """``ColumnBuilder`` whose spans stay bytes until one vectorized decode (one shard only)."""

    def __init__(self) -> None:
        super().__init__((0, 1))
        self.raw_spans: list[bytes] = []
        self.joined = b""
        self.buf = np.zeros(0, dtype=np.uint8)
        self.attr_rows = self.attr_start = self.attr_len = np.zeros(0, dtype=np.int64)

    def add_payload(self, payload: bytes, received: int) -> None:
        """Append every span of a serialized ``ExportTraceServiceRequest``."""
        for ri, si, ss in self.walk_scopes(RawRequest.FromString(payload)):
            self.raw_spans.extend(ss.spans)
            self.add_rows(ri, si, received, len(ss.spans))
        self.n = len(self.raw_spans)

    def finish(self, batch_id: str) -> tuple[pa.Table, np.ndarray, np.ndarray]:
        """Return the ``BASE_SCHEMA`` table, the dedupe keys and the content hashes (``Unusual``: use another builder)."""
        n = self.n
        digest = xxhash.xxh3_64_intdigest
        content = np.fromiter((digest(r) for r in self.raw_spans), dtype=np.uint64, count=n)
        lengths = np.fromiter(map(len, self.raw_spans), dtype=np.int64, count=n)
        end = np.cumsum(lengths)
        self.joined = b"".join([*self.raw_spans, bytes(16)])
        self.raw_spans = []
        self.buf = np.frombuffer(self.joined, dtype=np.uint8)
        f = walk(self.buf, end - lengths, end, SPAN_FIELDS)
        self._repeated(f)
        attributes = self._attributes()  # first: it finds the spans with repeated keys
        (tid, tjoined), (sid, sjoined) = self._hex_ids(f, 1, 16), self._hex_ids(f, 2, 8)
        keys = keys_from_ids(tjoined, sjoined, n) if tjoined is not None and sjoined is not None else \
            keys_from_hex(tid, sid)
        starts, ends = self._fixed64(f, 7).astype(np.int64), self._fixed64(f, 8).astype(np.int64)
        codes, msgs = self._status(f)
        cols = {
            "trace_id": tid, "span_id": sid, "parent_span_id": self._parents(f),
            "trace_state": _null_if_empty(self._strings(f, 3)),
            "name": self._strings(f, 5).cast(pa.string()).dictionary_encode(),
            "kind": pa.array(_small_int(f.last(6, n)[1], "span kind"), pa.int8()),
            "status_code": pa.array(codes, pa.int8()), "status_message": _null_if_empty(msgs),
            "start_time_unix_nano": pa.array(starts), "end_time_unix_nano": pa.array(ends),
            "duration_ns": pa.array(ends - starts), "quality_flags": self._flags(starts, ends),
            "attributes": attributes,
        }
        for k, name in ((10, "dropped_attributes_count"), (12, "dropped_events_count"), (14, "dropped_links_count")):
            cols[name] = pa.array(f.last(k, n)[1].astype(np.uint32).astype(np.int32))
        cols.update(self._shared(batch_id))
        arrays = [_as_type(cols[fd.name], fd.type) for fd in BASE_SCHEMA]
        return pa.Table.from_arrays(arrays, schema=BASE_SCHEMA), keys, content

    def _shared(self, batch_id: str) -> dict[str, pa.Array]:
        """The columns that come from the requests rather than the spans."""
        n = self.n
        return {
            "service_name": _dict_take(self.services, self.res_index),
            "scope_name": _dict_take([s[0] for s in self.scopes], self.scope_index),
            "scope_version": _dict_take([s[1] for s in self.scopes], self.scope_index),
            "received_unix_nano": pa.array(self.received, pa.int64()),
            "batch_id": pa.array([batch_id], pa.string()).take(pa.array(np.zeros(n, np.int32))),
            "resource_attributes": _resource_maps(self.resources).take(pa.array(self.res_index, pa.int32())),
            "events": _sparse(self.events, n, pa.list_(EVENT)),
            "links": _sparse(self.links, n, pa.list_(LINK)),
        }

    def _hex_ids(self, f: Fields, number: int, width: int) -> tuple[pa.Array, bytes | None]:
        """An id column in hex (and the ids joined, when all have ``width`` bytes)."""
        present, start, length = f.last(number, self.n)
        if present.all() and (length == width).all():
            joined = self.buf[start.astype(np.int64)[:, None] + np.arange(width)[None, :]].tobytes()
            return _hex_column_of(joined, self.n, width), joined
        ids = [self.joined[a : a + b] if ok else b"" for ok, a, b in
               zip(present.tolist(), start.astype(np.int64).tolist(), length.tolist(), strict=True)]
        return _hex_column(ids, width)

    def _parents(self, f: Fields) -> pa.Array:
        """Parent span ids in hex, null for a root (no or empty parent)."""
        present, start, length = f.last(4, self.n)
        has = present & (length > 0)
        if not ((length[has] == 8).all()):
            raise Unusual("parent span id of unusual length")
        at = np.where(has, start.astype(np.int64), 0)
        joined = self.buf[at[:, None] + np.arange(8)[None, :]].tobytes()
        hexed = _hex_column_of(joined, self.n, 8)
        return pc.if_else(pa.array(has), hexed, pa.scalar(None, pa.string()))

    def _strings(self, f: Fields, number: int) -> pa.Array:
        """A string field as Arrow strings over the buffer (``Unusual`` on invalid UTF-8)."""
        present, start, length = f.last(number, self.n)
        return self._text(np.where(present, start.astype(np.int64), 0), np.where(present, length, 0))

    def _text(self, start: np.ndarray, length: np.ndarray) -> pa.Array:
        arr = strings_at([(pa.py_buffer(self.joined), heads_of(self.joined))], np.zeros(len(start), dtype=np.int64), start, length)
        try:
            arr.validate(full=True)
        except pa.ArrowInvalid as exc:
            raise Unusual("invalid UTF-8 in a span string") from exc
        return arr

    def _fixed64(self, f: Fields, number: int) -> np.ndarray:
        present, start, _ = f.last(number, self.n)
        at = np.where(present, start.astype(np.int64), 0)
        raw = self.buf[at[:, None] + np.arange(8)[None, :]].copy().view("<u8").ravel()
        out: np.ndarray = np.where(present, raw, np.uint64(0)).astype(np.uint64)
        return out

    def _status(self, f: Fields) -> tuple[np.ndarray, pa.Array]:
        """Status code and message per span (0 and '' without a status)."""
        rows, start, length = f.all(15)
        if len(np.unique(rows)) != len(rows):
            raise Unusual("repeated span status")
        s = start.astype(np.int64)
        sf = walk(self.buf, s, s + length, STATUS_FIELDS)
        present, code, _ = sf.last(3, len(rows))
        codes = np.zeros(self.n, dtype=np.uint64)
        codes[rows] = np.where(present, code, np.uint64(0))
        present, mstart, mlen = sf.last(2, len(rows))
        at, ln = np.zeros(self.n, dtype=np.int64), np.zeros(self.n, dtype=np.int64)
        at[rows], ln[rows] = np.where(present, mstart.astype(np.int64), 0), np.where(present, mlen, 0)
        return _small_int(codes, "status code"), self._text(at, ln)

    def _repeated(self, f: Fields) -> None:
        rows, start, length = f.all(9)
        order = np.argsort(rows, kind="stable")
        self.attr_rows = rows[order]
        self.attr_start = start.astype(np.int64)[order]
        self.attr_len = length[order]
        for number, target, build, cls in ((11, self.events, _events, Span.Event), (13, self.links, _links, Span.Link)):
            r, s, ln = f.all(number)
            by_row: dict[int, list[bytes]] = {}
            for row, a, b in zip(r.tolist(), s.astype(np.int64).tolist(), ln.tolist(), strict=True):
                by_row.setdefault(row, []).append(self.joined[a : a + b])
            for row, items in by_row.items():
                target[row] = build(cls.FromString(b) for b in items)

    def _attributes(self) -> pa.Array:
        keys, vals = decode_ranges(self.joined, self.attr_start, self.attr_start + self.attr_len)
        counts = np.bincount(self.attr_rows, minlength=self.n).astype(np.int64)
        keys, vals, counts, self.dup_rows = collapse_duplicates(keys, vals, counts)
        offsets = np.zeros(len(counts) + 1, dtype=np.int32)
        np.cumsum(counts, out=offsets[1:])
        return pa.MapArray.from_arrays(pa.array(offsets), keys, vals)


def _small_int(values: np.ndarray, what: str) -> np.ndarray:
    """int32 enum values as the int8 the schema stores (``Unusual`` outside -128..127, as 10-byte negatives)."""
    v = values.astype(np.uint64).astype(np.int64)
    if ((v > 127) | (v < -128)).any():
        raise Unusual(f"{what} out of range")
    return v


def _null_if_empty(arr: pa.Array) -> pa.Array:
    """Strings with '' made null (as ``columnar._nullable_str``)."""
    out = arr.cast(pa.string())
    return pc.if_else(pc.equal(out, ""), pa.scalar(None, pa.string()), out)


def _hex_column_of(joined: bytes, n: int, width: int) -> pa.Array:
    offsets = pa.py_buffer(np.arange(0, 2 * width * (n + 1), 2 * width, dtype=np.int32))
    return pa.StringArray.from_buffers(n, offsets, pa.py_buffer(joined.hex().encode("ascii")))
