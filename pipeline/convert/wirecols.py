"""Span attributes decoded straight from the protobuf wire format, for a whole batch at once.

The requests are parsed with a *shadow* schema that is wire-compatible with OTLP but declares
``Span.attributes``, ``events`` and ``links`` (and the resource and scope) as ``bytes``: upb
hands over each attribute's serialized ``KeyValue`` without building a Python object for it.
All ``KeyValue`` records of the batch are then decoded together with numpy: tags and varint
lengths are read as vectors, and the key and string-value texts become Arrow ``string_view``
arrays pointing into the one buffer (cast to ``string`` in C). Boolean and integer values are
vectorized too; doubles, bytes, arrays, kvlists, an empty key or any non-canonical record take
the per-record path (``KeyValue.FromString`` + ``any_value_text``), so every value gets exactly
the text the reference converter gives it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from opentelemetry.proto.common.v1.common_pb2 import KeyValue

from tracedag.pipeline.convert.values import any_value_text
from tracedag.pipeline.normalize.byteranges import blob, heads_of, strings_at

_B, _S, _U32, _I32, _F32, _F64, _MSG = 12, 9, 13, 5, 7, 6, 11
_REPEATED, _OPTIONAL = 3, 1


def _message(fp: descriptor_pb2.FileDescriptorProto, name: str, fields: list[tuple[str, int, int, int, str]]) -> None:
    msg = fp.message_type.add(name=name)
    for fname, number, ftype, label, type_name in fields:
        f = msg.field.add(name=fname, number=number, type=ftype, label=label)
        if type_name:
            f.type_name = type_name


def _shadow_classes() -> dict[str, Any]:
    fp = descriptor_pb2.FileDescriptorProto(name="tracedag_shadow_otlp.proto", package="tracedag.shadow",
                                            syntax="proto3")
    o, r = _OPTIONAL, _REPEATED
    _message(fp, "Status", [("message", 2, _S, o, ""), ("code", 3, _I32, o, "")])
    _message(fp, "Span", [
        ("trace_id", 1, _B, o, ""), ("span_id", 2, _B, o, ""), ("trace_state", 3, _S, o, ""),
        ("parent_span_id", 4, _B, o, ""), ("flags", 16, _F32, o, ""), ("name", 5, _S, o, ""),
        ("kind", 6, _I32, o, ""), ("start_time_unix_nano", 7, _F64, o, ""),
        ("end_time_unix_nano", 8, _F64, o, ""), ("attributes", 9, _B, r, ""),
        ("dropped_attributes_count", 10, _U32, o, ""), ("events", 11, _B, r, ""),
        ("dropped_events_count", 12, _U32, o, ""), ("links", 13, _B, r, ""),
        ("dropped_links_count", 14, _U32, o, ""), ("status", 15, _MSG, o, ".tracedag.shadow.Status"),
    ])
    _message(fp, "ScopeSpans", [("scope", 1, _B, o, ""), ("spans", 2, _MSG, r, ".tracedag.shadow.Span"),
                                ("schema_url", 3, _S, o, "")])
    _message(fp, "ResourceSpans", [("resource", 1, _B, o, ""),
                                   ("scope_spans", 2, _MSG, r, ".tracedag.shadow.ScopeSpans"),
                                   ("schema_url", 3, _S, o, "")])
    _message(fp, "Request", [("resource_spans", 1, _MSG, r, ".tracedag.shadow.ResourceSpans")])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fp)
    return {m: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"tracedag.shadow.{m}"))
            for m in ("Request", "Span")}


SHADOW = _shadow_classes()
ShadowRequest: Any = SHADOW["Request"]


def _varint(buf: np.ndarray, pos: np.ndarray, max_bytes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Decode one varint at each position: (value, byte count, complete).

    Each further byte is read only at the positions whose varint goes on (most are one byte).
    """
    b = buf[pos]
    val = (b & 0x7F).astype(np.uint64)
    count = np.ones(len(pos), dtype=np.int64)
    done = np.ones(len(pos), dtype=bool)
    more = np.flatnonzero(b >= 0x80)
    for k in range(1, max_bytes):
        if not len(more):
            break
        b = buf[pos[more] + k]
        val[more] |= (b & 0x7F).astype(np.uint64) << np.uint64(7 * k)
        count[more] = k + 1
        more = more[b >= 0x80]
    done[more] = False
    return val, count, done


class _Records:
    """The serialized ``KeyValue`` records of a batch as one buffer plus offsets."""

    def __init__(self, joined: bytes, start: np.ndarray, end: np.ndarray) -> None:
        """Records at ``joined[start[i]:end[i]]``; ``joined`` ends with 16 zero bytes, so that
        reads just past the end (varints, 12-byte heads) stay in range."""
        self.data = pa.py_buffer(joined)
        self.start, self.end = start, end
        self.size = len(joined) - 16
        self.buf = np.frombuffer(joined, dtype=np.uint8)
        self.heads = heads_of(joined)

    @classmethod
    def of(cls, raw: list[bytes]) -> _Records:
        """The records of a list of serialized ``KeyValue``s, joined into one buffer."""
        lengths = np.fromiter(map(len, raw), dtype=np.int64, count=len(raw))
        end = np.cumsum(lengths)
        return cls(b"".join([*raw, bytes(16)]), end - lengths, end)

    def records(self, which: np.ndarray) -> pa.Array:
        """The serialized bytes of the records ``which``, as a ``binary`` array."""
        start = self.start[which]
        return strings_at([(self.data, self.heads)], np.zeros(len(which), dtype=np.int64), start,
                      self.end[which] - start, binary=True)

    def at(self, pos: np.ndarray) -> np.ndarray:
        """Clip positions into the padded buffer (malformed lengths must not index out of range)."""
        clipped: np.ndarray = np.clip(pos, 0, self.size)
        return clipped


def decode_keyvalues(raw: list[bytes]) -> tuple[pa.Array, pa.Array]:
    """Return the key and value-text arrays of serialized ``KeyValue`` records (same order)."""
    if not raw:
        return pa.array([], pa.string()), pa.array([], pa.string())
    return decode_records(_Records.of(raw))


def decode_ranges(joined: bytes, start: np.ndarray, end: np.ndarray) -> tuple[pa.Array, pa.Array]:
    """``decode_keyvalues`` of the records ``joined[start[i]:end[i]]`` (``joined`` padded with 16 zero bytes)."""
    if not len(start):
        return pa.array([], pa.string()), pa.array([], pa.string())
    return decode_records(_Records(joined, start, end))


def decode_records(r: _Records) -> tuple[pa.Array, pa.Array]:
    """The keys and value texts of the records of ``r``."""
    s, e, buf = r.start, r.end, r.buf
    ok = (e - s >= 2) & (buf[r.at(s)] == 0x0A)
    klen, kn, kdone = _varint(buf, r.at(s + 1), 5)
    ks = s + 1 + kn
    ke = ks + klen.astype(np.int64)
    ok &= kdone & (ke <= e)
    has_v = ke < e
    ok &= ~has_v | (buf[r.at(ke)] == 0x12)
    vlen, vn, vdone = _varint(buf, r.at(ke + 1), 5)
    vs = np.where(has_v, ke + 1 + vn, e)
    ok &= ~has_v | (vdone & (vs + vlen.astype(np.int64) == e))
    nonempty = ok & (vs < e)
    tag = np.where(nonempty, buf[r.at(vs)], 0)
    slen, sn, sdone = _varint(buf, r.at(vs + 1), 5)
    is_str = nonempty & (tag == 0x0A) & sdone & (vs + 1 + sn + slen.astype(np.int64) == e)
    is_bool = nonempty & (tag == 0x10) & (vs + 2 == e) & (buf[r.at(vs + 1)] < 2)
    is_int = nonempty & (tag == 0x18)
    ival, inn, idone = _varint(buf, r.at(vs[is_int] + 1), 10)
    int_ok = idone & (vs[is_int] + 1 + inn == e[is_int])
    is_int[is_int] = int_ok
    is_double = nonempty & (tag == 0x21) & (vs + 9 == e)
    slow = ~ok | (nonempty & ~(is_str | is_bool | is_int | is_double))
    fix = _Fixes()
    fix.add(is_bool, pa.array(np.where(buf[r.at(vs[is_bool] + 1)] == 1, "true", "false")))
    fix.add(is_int, pa.array(ival[int_ok].astype(np.int64)).cast(pa.string()))  # the decimal text, as str()
    doubles = buf[r.at(vs[is_double] + 1)[:, None] + np.arange(8)[None, :]].copy().view("<f8").ravel()
    fix.add(is_double, pa.array([str(d) for d in doubles.tolist()], pa.string()))
    key_fix = _Fixes()
    if slow.any():
        key_fix.add(slow, _slow(r, slow, fix))
    keys = key_fix.views((r.data, r.heads), np.where(ok, ks, 0), np.where(ok, klen.astype(np.int64), 0))
    vals = fix.views((r.data, r.heads), np.where(is_str, vs + 1 + sn, 0), np.where(is_str, slen.astype(np.int64), 0))
    keys.validate(full=True)  # UTF-8 of the texts taken straight from the wire
    vals.validate(full=True)
    return keys, vals


class _Fixes:
    """Value texts that replace the placeholders of non-string records, applied in one pass."""

    def __init__(self) -> None:
        self.index: list[np.ndarray] = []
        self.texts: list[pa.Array] = []

    def add(self, mask: np.ndarray, texts: pa.Array) -> None:
        """Record the texts (a ``string`` array) of the records selected by ``mask``, in order."""
        if len(texts):
            self.index.append(np.nonzero(mask)[0])
            self.texts.append(texts)

    def views(self, base: tuple[pa.Buffer, np.ndarray], starts: np.ndarray, lengths: np.ndarray) -> pa.Array:
        """The texts: byte ranges of ``base``, except the recorded records, which take their text."""
        which = np.zeros(len(starts), dtype=np.int64)
        if not self.texts:
            return strings_at([base], which, starts, lengths)
        idx = np.concatenate(self.index)
        extra, fstarts, flengths = blob(pa.concat_arrays(self.texts))
        starts, lengths = starts.copy(), lengths.copy()
        which[idx], starts[idx], lengths[idx] = 1, fstarts, flengths
        return strings_at([base, extra], which, starts, lengths)


def _slow(r: _Records, slow: np.ndarray, fix: _Fixes) -> pa.Array:
    """Decode the records the vectorized pass left (arrays, kvlists, bytes, odd encodings); return keys.

    Identical records (e.g. ``gen_ai.response.finish_reasons=["stop"]``) are decoded once.
    """
    distinct = pc.dictionary_encode(r.records(np.nonzero(slow)[0]))
    keys, vals = [], []
    for raw in distinct.dictionary.to_pylist():
        kv = KeyValue.FromString(raw)
        keys.append(kv.key)
        vals.append(any_value_text(kv.value))
    fix.add(slow, pa.array(vals, pa.string()).take(distinct.indices))
    return pa.array(keys, pa.string()).take(distinct.indices)


def collapse_duplicates(
    keys: pa.Array, vals: pa.Array, counts: np.ndarray
) -> tuple[pa.Array, pa.Array, np.ndarray, list[int]]:
    """Collapse keys repeated within a span (last value, first position): new keys, values, counts, rows."""
    n = len(counts)
    span_of = np.repeat(np.arange(n, dtype=np.int64), counts)
    codes = keys.dictionary_encode().indices.to_numpy(zero_copy_only=False).astype(np.int64)
    combined = span_of * (int(codes.max(initial=0)) + 1) + codes
    if not _has_repeats(combined):
        return keys, vals, counts, []
    _, first = np.unique(combined, return_index=True)
    _, last = np.unique(combined[::-1], return_index=True)
    last = len(combined) - 1 - last
    order = np.argsort(first, kind="stable")
    keep, source = first[order], last[order]
    new_counts = np.bincount(span_of[keep], minlength=n)
    dup_rows = np.nonzero(new_counts != counts)[0].tolist()
    return keys.take(pa.array(keep)), vals.take(pa.array(source)), new_counts, dup_rows


def _has_repeats(combined: np.ndarray) -> bool:
    """Whether any value occurs twice (a counting pass when the range is small, else a sort)."""
    if len(combined) == 0:
        return False
    top = int(combined.max())
    if top < 64 * len(combined) + 1024:
        return bool(np.bincount(combined, minlength=top + 1).max() > 1)
    return len(np.unique(combined)) != len(combined)
