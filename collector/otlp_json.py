"""OTLP/JSON -> ``ExportTraceServiceRequest`` by the OTLP specification's rules.

Not ``json_format.Parse``: trace/span ids are case-insensitive hex (not base64), 64-bit
integers come as strings or numbers, unknown keys are ignored at every level, snake_case keys
are unknown keys, enum names are accepted with a warning, and nesting is bounded.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tracedag.collector.wire import MAX_DEPTH
from tracedag.schemas.errors import TracedagError


class JsonDecodeError(TracedagError):  # type: ignore[misc,unused-ignore]
    """The body is not an OTLP/JSON ``ExportTraceServiceRequest``."""


_HEX_ID_FIELDS = frozenset({"trace_id", "span_id", "parent_span_id"})
_SPAN = "opentelemetry.proto.trace.v1.Span"
_T = FieldDescriptor
_INT64 = {_T.TYPE_INT64, _T.TYPE_SINT64, _T.TYPE_SFIXED64}
_UINT64 = {_T.TYPE_UINT64, _T.TYPE_FIXED64}
_INT32 = {_T.TYPE_INT32, _T.TYPE_SINT32, _T.TYPE_SFIXED32}
_UINT32 = {_T.TYPE_UINT32, _T.TYPE_FIXED32}
_RANGES = {
    **{t: (-(2**63), 2**63 - 1) for t in _INT64},
    **{t: (0, 2**64 - 1) for t in _UINT64},
    **{t: (-(2**31), 2**31 - 1) for t in _INT32},
    **{t: (0, 2**32 - 1) for t in _UINT32},
}


@dataclass
class JsonContext:
    """What the walk learned besides the message: bad ids per span, warnings, snake_case keys."""

    span_index: int = -1
    bad_ids: dict[int, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    snake_case_keys: set[str] = field(default_factory=set)


def parse_json_request(body: bytes) -> tuple[ExportTraceServiceRequest, JsonContext]:
    """Decode an OTLP/JSON body; raise ``JsonDecodeError`` when it is not one."""
    doc = _load(body)
    if not isinstance(doc, dict):
        raise JsonDecodeError("OTLP/JSON body must be a JSON object (ExportTraceServiceRequest)")
    request = ExportTraceServiceRequest()
    ctx = JsonContext()
    _fill(request, doc, ctx, "", 1)
    return request, ctx


def _reject_constant(name: str) -> Any:
    raise JsonDecodeError(f"invalid JSON: {name} is not a JSON value")


def _load(body: bytes) -> Any:
    try:
        return json.loads(body, parse_constant=_reject_constant)
    except RecursionError as exc:
        raise JsonDecodeError("invalid JSON: nested too deeply") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise JsonDecodeError(f"invalid JSON: {exc}") from exc


def _fill(msg: Message, obj: dict[str, Any], ctx: JsonContext, path: str, depth: int) -> None:
    """Set the fields of ``msg`` from the JSON object ``obj``."""
    if depth > MAX_DEPTH:
        raise JsonDecodeError(f"{path or 'body'}: nested deeper than {MAX_DEPTH} levels")
    desc = msg.DESCRIPTOR
    if desc.full_name == _SPAN:
        ctx.span_index += 1
    by_json = _json_names(desc)
    for key, value in obj.items():
        fd = by_json.get(key)
        if fd is None:
            if key in desc.fields_by_name and desc.fields_by_name[key].json_name != key:
                ctx.snake_case_keys.add(key)
            continue
        if value is None:
            continue
        _set_field(msg, fd, value, ctx, f"{path}.{key}" if path else key, depth)


_JSON_NAMES: dict[str, dict[str, FieldDescriptor]] = {}


def _json_names(desc: Any) -> dict[str, FieldDescriptor]:
    names = _JSON_NAMES.get(desc.full_name)
    if names is None:
        names = {f.json_name: f for f in desc.fields}
        _JSON_NAMES[desc.full_name] = names
    return names


def _is_repeated(fd: FieldDescriptor) -> bool:
    return bool(fd.is_repeated)


def _set_field(msg: Message, fd: FieldDescriptor, value: Any, ctx: JsonContext, path: str, depth: int) -> None:
    if _is_repeated(fd):
        if not isinstance(value, list):
            raise JsonDecodeError(f"{path}: expected an array")
        target = getattr(msg, fd.name)
        for i, item in enumerate(value):
            if item is None:
                continue
            if fd.type == _T.TYPE_MESSAGE:
                _fill_object(target.add(), item, ctx, f"{path}[{i}]", depth)
            else:
                target.append(_scalar(msg, fd, item, ctx, f"{path}[{i}]"))
        return
    if fd.type == _T.TYPE_MESSAGE:
        sub = getattr(msg, fd.name)
        sub.SetInParent()
        _fill_object(sub, value, ctx, path, depth)
        return
    setattr(msg, fd.name, _scalar(msg, fd, value, ctx, path))


def _fill_object(msg: Message, value: Any, ctx: JsonContext, path: str, depth: int) -> None:
    if not isinstance(value, dict):
        raise JsonDecodeError(f"{path}: expected an object")
    _fill(msg, value, ctx, path, depth + 1)


def _scalar(msg: Message, fd: FieldDescriptor, value: Any, ctx: JsonContext, path: str) -> Any:
    t = fd.type
    if t == _T.TYPE_STRING:
        return _text(value, path)
    if t == _T.TYPE_BOOL:
        return _expect(value, bool, path, "true or false")
    if t == _T.TYPE_BYTES:
        if fd.name in _HEX_ID_FIELDS:
            return _hex_id(value, ctx, path)
        return _base64(value, path)
    if t in _RANGES:
        return _integer(value, _RANGES[t], path)
    if t in (_T.TYPE_DOUBLE, _T.TYPE_FLOAT):
        return _double(value, path)
    if t == _T.TYPE_ENUM:
        return _enum(fd, value, ctx, path)
    raise JsonDecodeError(f"{path}: unsupported field type")


def _expect(value: Any, kind: type, path: str, what: str) -> Any:
    if not isinstance(value, kind):
        raise JsonDecodeError(f"{path}: expected {what}")
    return value


def _text(value: Any, path: str) -> str:
    """A string field's value: protobuf strings are UTF-8, so an escaped lone surrogate is refused."""
    text: str = _expect(value, str, path, "a string")
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            bad = ord(text[exc.start])
            raise JsonDecodeError(
                f"{path}: string holds a lone UTF-16 surrogate (\\u{bad:04x} at character {exc.start}), "
                "which is not Unicode text"
            ) from exc
    return text


def _hex_id(value: Any, ctx: JsonContext, path: str) -> bytes:
    """Decode a hex id; a bad one marks the current span invalid instead of failing the request."""
    if not isinstance(value, str):
        raise JsonDecodeError(f"{path}: expected a hex string")
    try:
        return binascii.unhexlify(value)
    except (binascii.Error, ValueError):
        name = path.rsplit(".", 1)[-1]
        ctx.bad_ids.setdefault(ctx.span_index, f"{name} is not hex (OTLP/JSON ids are hex, not base64)")
        return b""


def _base64(value: Any, path: str) -> bytes:
    if not isinstance(value, str):
        raise JsonDecodeError(f"{path}: expected a base64 string")
    text = value.replace("-", "+").replace("_", "/")
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise JsonDecodeError(f"{path}: not valid base64") from exc


def _integer(value: Any, bounds: tuple[int, int], path: str) -> int:
    if isinstance(value, bool):
        raise JsonDecodeError(f"{path}: expected an integer")
    if isinstance(value, int):
        n = value
    elif _integral_float(value) or (isinstance(value, str) and _is_decimal(value)):
        n = int(value)
    else:
        raise JsonDecodeError(f"{path}: expected an integer (number or decimal string)")
    if not bounds[0] <= n <= bounds[1]:
        raise JsonDecodeError(f"{path}: integer out of range")
    return n


def _integral_float(value: Any) -> bool:
    return isinstance(value, float) and value.is_integer() and abs(value) < 2**53


def _is_decimal(text: str) -> bool:
    digits = text[1:] if text.startswith("-") else text
    return 0 < len(digits) <= 20 and digits.isascii() and digits.isdigit()


def _double(value: Any, path: str) -> float:
    if isinstance(value, bool):
        raise JsonDecodeError(f"{path}: expected a number")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        special = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
        if value in special:
            return special[value]
        try:
            return float(value)
        except ValueError:
            pass
    raise JsonDecodeError(f"{path}: expected a number")


def _enum(fd: FieldDescriptor, value: Any, ctx: JsonContext, path: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and -(2**31) <= value < 2**31:
        return value
    enum = fd.enum_type
    if isinstance(value, str) and enum is not None and value in enum.values_by_name:
        ctx.warnings.append(
            f"{path}: enum given by name {value!r}; OTLP/JSON requires the integer "
            f"{enum.values_by_name[value].number}"
        )
        return int(enum.values_by_name[value].number)
    raise JsonDecodeError(f"{path}: expected an enum integer")
