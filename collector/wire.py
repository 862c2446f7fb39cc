"""Protobuf parsing of OTLP requests with a nesting limit of our own.

upb (the protobuf runtime) refuses messages nested deeper than 100 levels, which is only about
47 levels of nested ``AnyValue`` arrays. Legitimate GenAI attributes may nest 64 deep, so when
upb gives up on depth we walk the wire format ourselves down to ``MAX_DEPTH`` message levels,
letting upb parse every non-message field (UTF-8 checks, packed fields, ranges stay upb's).
"""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

MAX_DEPTH = 256  # message levels: AnyValue kvlists nested 64 deep need about 200

_UPB_DEPTH_HINT = "MaxDepth"


class TooDeep(DecodeError):
    """The message nests deeper than ``MAX_DEPTH``."""


def parse_request(body: bytes) -> ExportTraceServiceRequest:
    """Parse a serialized ``ExportTraceServiceRequest``, allowing nesting up to ``MAX_DEPTH``."""
    try:
        return ExportTraceServiceRequest.FromString(body)
    except DecodeError as exc:
        if _UPB_DEPTH_HINT not in str(exc):
            raise
    request = ExportTraceServiceRequest()
    _merge(request, memoryview(body), 1)
    return request


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise DecodeError("truncated or overlong varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _skip(buf: memoryview, pos: int, wire_type: int) -> int:
    """Return the position after a field value of ``wire_type`` starting at ``pos``."""
    if wire_type == 0:
        return _varint(buf, pos)[1]
    if wire_type == 1:
        end = pos + 8
    elif wire_type == 5:
        end = pos + 4
    elif wire_type == 2:
        length, pos = _varint(buf, pos)
        end = pos + length
    else:
        raise DecodeError(f"unsupported wire type {wire_type}")
    if end > len(buf):
        raise DecodeError("truncated field")
    return end


def _merge(msg: Message, buf: memoryview, depth: int) -> None:
    """Merge the wire bytes ``buf`` into ``msg``, recursing into message fields ourselves."""
    if depth > MAX_DEPTH:
        raise TooDeep(f"message nesting deeper than {MAX_DEPTH} levels")
    fields = msg.DESCRIPTOR.fields_by_number
    scalars = bytearray()
    pos = 0
    while pos < len(buf):
        start = pos
        key, pos = _varint(buf, pos)
        number, wire_type = key >> 3, key & 7
        field = fields.get(number)
        if field is not None and field.type == FieldDescriptor.TYPE_MESSAGE and wire_type == 2:
            length, pos = _varint(buf, pos)
            if pos + length > len(buf):
                raise DecodeError("truncated message field")
            _merge(_sub_message(msg, field), buf[pos : pos + length], depth + 1)
            pos += length
            continue
        pos = _skip(buf, pos, wire_type)
        scalars += buf[start:pos]
    if scalars:
        msg.MergeFromString(bytes(scalars))


def _sub_message(msg: Message, field: Any) -> Message:
    if _is_repeated(field):
        sub: Message = getattr(msg, field.name).add()
        return sub
    sub = getattr(msg, field.name)
    sub.SetInParent()
    return sub


def _is_repeated(field: Any) -> bool:
    return bool(field.is_repeated)
