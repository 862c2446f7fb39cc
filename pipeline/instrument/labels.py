"""Run labels and the conversation id, carried in the OpenTelemetry context onto every span.

``conversation`` and ``run_labels`` do not create spans: they put attributes into the current
context, and :class:`LabelSpanProcessor` copies them onto each span that starts inside it (from
any instrumentation: tracedag's helpers, OpenInference, OpenLLMetry, plain OTel). A span that
already carries one of these attributes keeps its own value.

Nesting: an inner block adds its labels to the enclosing ones, and for a label both set, the
innermost value applies to the spans started inside the inner block (the enclosing value comes
back when it ends). Giving a label a different value than an enclosing block did is most often a
mistake (a replay's run id inside another run), so it is logged as a warning naming the label
and both values, once per label and pair of values.

Across processes: :func:`propagation_headers` gives the headers of a call to another service (W3C
``traceparent``, and ``baggage`` carrying the labels); a service that extracts them
(``opentelemetry.propagate.extract``) continues the trace, and :class:`LabelSpanProcessor` stamps
the ``tracedag.*`` and ``gen_ai.conversation.id`` baggage entries on its spans as labels.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager

from opentelemetry import baggage, propagate, trace
from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

logger = logging.getLogger(__name__)

AttrValue = str | bool | int | float
_LABELS_KEY = otel_context.create_key("tracedag.labels")

CONVERSATION_ID = "gen_ai.conversation.id"
RUN_ID = "tracedag.run_id"
SCENARIO_ID = "tracedag.scenario_id"
REPLAY_INDEX = "tracedag.replay_index"
VARIANT_ID = "tracedag.variant_id"
INTENDED_PATH = "tracedag.intended_path"


def current_labels(ctx: otel_context.Context | None = None) -> dict[str, AttrValue]:
    """Return the labels active in ``ctx`` (default: the current context)."""
    value = otel_context.get_value(_LABELS_KEY, ctx)
    return dict(value) if isinstance(value, Mapping) else {}


def set_if_absent(span: trace.Span, key: str, value: AttrValue | Sequence[str] | None) -> bool:
    """Set ``key`` on ``span`` unless it is already set (or ``value`` is None); True if set."""
    if value is None or not span.is_recording():
        return False
    existing = getattr(span, "attributes", None) or {}
    if key in existing:
        return False
    span.set_attribute(key, value)
    return True


@contextmanager
def labels(values: Mapping[str, AttrValue | None]) -> Iterator[dict[str, AttrValue]]:
    """Add ``values`` (None entries skipped) to the labels of the current context; the innermost wins."""
    merged = current_labels()
    given = {k: v for k, v in values.items() if v is not None}
    _warn_overrides(merged, given)
    merged.update(given)
    current = trace.get_current_span()
    for key, value in merged.items():
        set_if_absent(current, key, value)
    token = otel_context.attach(otel_context.set_value(_LABELS_KEY, merged))
    try:
        yield merged
    finally:
        otel_context.detach(token)


_WARNED: set[tuple[str, str, str]] = set()


def _warn_overrides(outer: Mapping[str, AttrValue], inner: Mapping[str, AttrValue]) -> None:
    for key, value in inner.items():
        if key in outer and outer[key] != value:
            seen = (key, repr(outer[key]), repr(value))
            if seen not in _WARNED:
                _WARNED.add(seen)
                logger.warning("nested labels: %s=%r inside a block with %s=%r; the inner value applies to the "
                               "spans started inside it", key, value, key, outer[key])


def conversation(conversation_id: str) -> AbstractContextManager[dict[str, AttrValue]]:
    """Context manager: every span started inside belongs to conversation ``conversation_id``."""
    return labels({CONVERSATION_ID: conversation_id})


def run_labels(
    *,
    run_id: str | None = None,
    scenario_id: str | None = None,
    replay_index: int | None = None,
    variant_id: str | None = None,
    intended_path: Sequence[str] | None = None,
    **extra: AttrValue,
) -> AbstractContextManager[dict[str, AttrValue]]:
    """Context manager: stamp the ``tracedag.*`` run labels on every span started inside.

    Extra keyword labels are written as ``tracedag.<name>``.
    """
    values: dict[str, AttrValue | None] = {
        RUN_ID: run_id,
        SCENARIO_ID: scenario_id,
        REPLAY_INDEX: replay_index,
        VARIANT_ID: variant_id,
        INTENDED_PATH: json.dumps(list(intended_path)) if intended_path is not None else None,
    }
    values.update({f"tracedag.{k}": v for k, v in extra.items()})
    return labels(values)


def _is_label_key(key: str) -> bool:
    return key.startswith("tracedag.") or key == CONVERSATION_ID


def baggage_labels(ctx: otel_context.Context | None = None) -> dict[str, str]:
    """The labels an upstream service sent as W3C baggage (``tracedag.*`` and ``gen_ai.conversation.id``)."""
    return {k: str(v) for k, v in baggage.get_all(ctx).items() if _is_label_key(k)}


def propagation_headers(ctx: otel_context.Context | None = None) -> dict[str, str]:
    """Headers for a call to another service: the trace context (``traceparent``, with the configured
    propagators) and the current labels as ``baggage``, so the callee's spans join this trace and run."""
    ctx = ctx if ctx is not None else otel_context.get_current()
    for key, value in current_labels(ctx).items():
        ctx = baggage.set_baggage(key, str(value), ctx)
    headers: dict[str, str] = {}
    propagate.inject(headers, context=ctx)
    return headers


class LabelSpanProcessor(SpanProcessor):
    """Copies the context's labels onto each starting span, never replacing an existing value.

    ``configure`` installs it; add it yourself to a TracerProvider you set up on your own. Labels that
    arrived as baggage from a caller (``from_baggage``) are stamped too, after the context's own.
    """

    def __init__(self, from_baggage: bool = True) -> None:
        self.from_baggage = from_baggage

    def on_start(self, span: Span, parent_context: otel_context.Context | None = None) -> None:
        """Stamp the labels of ``parent_context`` (or the current context) on ``span``."""
        for key, value in current_labels(parent_context).items():
            set_if_absent(span, key, value)
        if self.from_baggage:
            for key, text in baggage_labels(parent_context).items():
                set_if_absent(span, key, _label_value(key, text))

    def on_end(self, span: ReadableSpan) -> None:
        """Nothing to do when a span ends."""

    def shutdown(self) -> None:
        """Nothing to release."""

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Nothing is buffered."""
        return True


def _label_value(key: str, text: str) -> AttrValue:
    """A baggage value (always text) back as the label's type: ``replay_index`` is an integer."""
    if key == REPLAY_INDEX and text.lstrip("-").isdigit():
        return int(text)
    return text
