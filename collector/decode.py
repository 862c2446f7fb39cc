"""Decode and validate one OTLP ``ExportTraceServiceRequest`` body (protobuf or OTLP/JSON).

``decode_request`` keeps only the valid spans (trace id 16 bytes, span id 8 bytes, neither all
zero, parent empty or 8 bytes, link ids of the right length) and says why the others were
rejected. Undecodable input, or a request whose spans are all invalid, raises ``DecodeError``
(HTTP 400 / gRPC INVALID_ARGUMENT). ``Limits`` may also reject spans with more attributes or
events than configured (counted like invalid spans). With ``max_attribute_bytes``, longer string/bytes attribute
values (also inside arrays and kvlists, of resources, scopes, spans, events and links) are cut
to that many bytes at a UTF-8 character boundary and the span is kept, with a warning.
``Decoded.payload`` is what the spool stores: the original protobuf bytes when nothing was
dropped or cut, else the re-serialized request.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Literal

from google.protobuf.message import DecodeError as ProtoDecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from tracedag.collector.otlp_json import JsonContext, JsonDecodeError, parse_json_request
from tracedag.collector.wire import parse_request
from tracedag.schemas.errors import TracedagError

Encoding = Literal["protobuf", "json"]

_ZERO16 = bytes(16)
_ZERO8 = bytes(8)


class DecodeError(TracedagError):  # type: ignore[misc,unused-ignore]
    """The body cannot be decoded, or none of its spans is valid (HTTP 400, never retried)."""

    def __init__(self, message: str, rejected: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.rejected = rejected  # spans found and rejected (0 when undecodable)


@dataclass(frozen=True)
class Decoded:
    """A decoded request with only its valid spans, and what was rejected and why."""

    request: ExportTraceServiceRequest
    accepted: int
    rejected: int
    message: str  # English reason for rejections or warnings, "" if none
    payload: bytes = field(default=b"", repr=False)  # serialized ``request``
    reasons: tuple[tuple[str, int], ...] = ()  # (reason, spans) of the rejections
    truncated: int = 0  # attribute values cut to max_attribute_bytes


@dataclass(frozen=True)
class Limits:
    """Optional limits on what one span may carry (None: unlimited, up to the body limit)."""

    max_attribute_bytes: int | None = None  # longer string/bytes values are cut (span kept)
    max_span_attributes: int | None = None  # spans with more attributes are rejected
    max_span_events: int | None = None  # spans with more events are rejected


NO_LIMITS = Limits()


def decode_request(body: bytes, encoding: Encoding, limits: Limits = NO_LIMITS) -> Decoded:
    """Decode ``body`` and keep its valid spans; raise ``DecodeError`` when nothing usable is in it."""
    if encoding == "protobuf":
        request = _parse_protobuf(body)
        ctx = JsonContext()
    else:
        try:
            request, ctx = parse_json_request(body)
        except JsonDecodeError as exc:
            raise DecodeError(str(exc)) from exc
    accepted, reasons = _drop_invalid(request, ctx.bad_ids)
    if limits.max_span_attributes is not None or limits.max_span_events is not None:
        oversized = _drop_oversized(request, limits)
        accepted -= sum(oversized.values())
        reasons.update(oversized)
    rejected = sum(reasons.values())
    message = _message(reasons, ctx, accepted + rejected)
    if rejected and not accepted:
        raise DecodeError(message, rejected)
    cut: Counter[str] = Counter()
    max_bytes = limits.max_attribute_bytes
    if max_bytes is not None and len(body) > max_bytes:  # else no value can be longer
        cut = truncate_attributes(request, max_bytes)
        message = ". ".join(p for p in (message, _truncation_message(cut, max_bytes)) if p)
    unchanged = encoding == "protobuf" and not rejected and not cut
    payload = body if unchanged else request.SerializeToString()
    reasons_sorted = tuple(sorted(reasons.items()))
    return Decoded(request, accepted, rejected, message, payload, reasons_sorted, sum(cut.values()))


def _parse_protobuf(body: bytes) -> ExportTraceServiceRequest:
    try:
        request: ExportTraceServiceRequest = parse_request(body)
    except ProtoDecodeError as exc:
        raise DecodeError(f"invalid protobuf ExportTraceServiceRequest: {exc}") from exc
    except RecursionError as exc:
        raise DecodeError("invalid protobuf ExportTraceServiceRequest: nested too deeply") from exc
    return request


def span_problem(span: Span) -> str | None:
    """Return why ``span`` is invalid, or None when its ids are valid."""
    trace_id = span.trace_id
    if len(trace_id) != 16:
        return "trace_id must be 16 bytes"
    if trace_id == _ZERO16:
        return "trace_id is all zero"
    span_id = span.span_id
    if len(span_id) != 8:
        return "span_id must be 8 bytes"
    if span_id == _ZERO8:
        return "span_id is all zero"
    if len(span.parent_span_id) not in (0, 8):
        return "parent_span_id must be empty or 8 bytes"
    for link in span.links:
        if len(link.trace_id) != 16 or len(link.span_id) != 8:
            return "link ids must be 16 (trace) and 8 (span) bytes"
    return None


_IDS = attrgetter("trace_id", "span_id", "parent_span_id", "links")


def _all_valid(spans: Sequence[Span]) -> bool:
    """Fast check (C-level loops) that every span's ids are valid and none has links to check."""
    rows = list(map(_IDS, spans))
    if not rows:
        return True
    trace_ids, span_ids, parents, links = zip(*rows, strict=True)
    return (
        set(map(len, trace_ids)) == {16} and set(map(len, span_ids)) == {8}
        and _ZERO16 not in trace_ids and _ZERO8 not in span_ids
        and set(map(len, parents)) <= {0, 8} and not any(links)
    )


def _drop_invalid(request: ExportTraceServiceRequest, bad_ids: dict[int, str]) -> tuple[int, Counter[str]]:
    """Remove invalid spans in place; return (accepted, rejected count per reason)."""
    reasons: Counter[str] = Counter()
    accepted = 0
    index = 0
    for rs in request.resource_spans:
        for ss in rs.scope_spans:
            spans = ss.spans
            if not bad_ids and _all_valid(spans):
                accepted += len(spans)
                index += len(spans)
                continue
            drop: list[int] = []
            for i, span in enumerate(spans):
                reason = bad_ids.get(index) or span_problem(span)
                index += 1
                if reason is None:
                    accepted += 1
                else:
                    reasons[reason] += 1
                    drop.append(i)
            for i in reversed(drop):
                del spans[i]
    return accepted, reasons


def _size_problem(span: Span, limits: Limits) -> str | None:
    """Return why ``span`` carries more than ``limits`` allow, or None."""
    if limits.max_span_attributes is not None and len(span.attributes) > limits.max_span_attributes:
        return f"more than max_span_attributes={limits.max_span_attributes} attributes"
    if limits.max_span_events is not None and len(span.events) > limits.max_span_events:
        return f"more than max_span_events={limits.max_span_events} events"
    return None


def _drop_oversized(request: ExportTraceServiceRequest, limits: Limits) -> Counter[str]:
    """Remove spans over the per-span limits in place; return the rejected count per reason."""
    reasons: Counter[str] = Counter()
    for rs in request.resource_spans:
        for ss in rs.scope_spans:
            spans = ss.spans
            problems = [(i, _size_problem(span, limits)) for i, span in enumerate(spans)]
            for i, problem in reversed(problems):
                if problem is not None:
                    reasons[problem] += 1
                    del spans[i]
    return reasons


def truncate_attributes(request: ExportTraceServiceRequest, limit: int) -> Counter[str]:
    """Cut string/bytes attribute values longer than ``limit`` bytes; return the cuts per attribute key."""
    cut: Counter[str] = Counter()
    for rs in request.resource_spans:
        _cut_all(rs.resource.attributes, limit, cut)
        for ss in rs.scope_spans:
            _cut_all(ss.scope.attributes, limit, cut)
            for span in ss.spans:
                _cut_all(span.attributes, limit, cut)
                for event in span.events:
                    _cut_all(event.attributes, limit, cut)
                for link in span.links:
                    _cut_all(link.attributes, limit, cut)
    return cut


def _cut_all(attributes: Iterable[KeyValue], limit: int, cut: Counter[str]) -> None:
    for kv in attributes:
        n = _cut_value(kv.value, limit)
        if n:
            cut[kv.key] += n


def _cut_value(value: AnyValue, limit: int) -> int:
    """Cut the over-long strings/bytes in ``value`` (recursing into arrays and kvlists); return how many."""
    kind = value.WhichOneof("value")
    if kind == "string_value":
        text = value.string_value
        if len(text) * 4 <= limit:  # a character is at most 4 UTF-8 bytes
            return 0
        raw = text.encode("utf-8")
        if len(raw) <= limit:
            return 0
        value.string_value = raw[:limit].decode("utf-8", "ignore")  # drops a split last character only
        return 1
    if kind == "bytes_value":
        if len(value.bytes_value) <= limit:
            return 0
        value.bytes_value = value.bytes_value[:limit]
        return 1
    if kind == "array_value":
        return sum(_cut_value(v, limit) for v in value.array_value.values)
    if kind == "kvlist_value":
        return sum(_cut_value(kv.value, limit) for kv in value.kvlist_value.values)
    return 0


def _truncation_message(cut: Counter[str], limit: int) -> str:
    if not cut:
        return ""
    keys = sorted(cut)
    shown = ", ".join(repr(k[:200]) for k in keys[:3])
    more = f" (and {len(keys) - 3} more keys)" if len(keys) > 3 else ""
    return (
        f"warning: {sum(cut.values())} attribute values longer than max_attribute_bytes={limit} "
        f"were truncated to {limit} bytes: {shown}{more}"
    )


def _message(reasons: Counter[str], ctx: JsonContext, total: int) -> str:
    parts: list[str] = []
    if reasons:
        detail = "; ".join(f"{reason} ({n})" for reason, n in sorted(reasons.items()))
        parts.append(f"rejected {sum(reasons.values())} of {total} spans: {detail}")
        if ctx.snake_case_keys:
            keys = ", ".join(sorted(ctx.snake_case_keys))
            parts.append(
                f"OTLP/JSON keys must be lowerCamelCase (e.g. traceId, spanId); "
                f"snake_case keys are ignored: {keys}"
            )
    if ctx.warnings:
        shown = "; ".join(ctx.warnings[:3])
        more = f" (and {len(ctx.warnings) - 3} more)" if len(ctx.warnings) > 3 else ""
        parts.append(f"warning: {shown}{more}")
    return ". ".join(parts)
