"""Step spans: ``agent``, ``node``, ``llm`` and ``tool``, each a context manager and a decorator.

Every helper opens one span with the OTel GenAI attributes of its kind and yields a :class:`Step`
to record what happened (output, usage, tool result). With ``new_span=False`` it annotates the
span that is already current (one made by OpenInference or OpenLLMetry, say) instead, and never
replaces an attribute that span already has. An exception leaving the block sets status ERROR,
``error.type`` and an ``exception`` event, then propagates.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, ParamSpec, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from tracedag.instrument import recorded, setup
from tracedag.instrument.labels import AttrValue, set_if_absent

logger = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")
Attrs = Mapping[str, AttrValue | Sequence[str] | None]
Message = Mapping[str, Any] | tuple[str, str] | str

_CHAIN_KEY = otel_context.create_key("tracedag.node_chain")
ToolCall = tuple[str, Mapping[str, Any] | None]
"""A tool step's name and arguments (None: the decorated function's arguments)."""


def to_json(value: object) -> str:
    """Serialize ``value`` as compact JSON (objects JSON cannot hold become their ``str``)."""
    return json.dumps(value, default=str, separators=(",", ":"), ensure_ascii=False)


def error_type(exc: BaseException) -> str:
    """Return the ``error.type`` of an exception: its qualified class name (builtins unqualified)."""
    cls = type(exc)
    if cls.__module__ in ("builtins", "__main__"):
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def messages_json(messages: Sequence[Message], *, default_role: str = "user") -> str:
    """Encode messages in the GenAI ``gen_ai.input.messages`` / ``output.messages`` JSON shape.

    Accepts plain strings, ``(role, text)`` pairs and ``{"role", "content"}`` dicts; dicts that
    already have ``parts`` pass through unchanged.
    """
    out: list[Mapping[str, Any]] = []
    for message in messages:
        if isinstance(message, str):
            out.append({"role": default_role, "parts": [{"type": "text", "content": message}]})
        elif isinstance(message, tuple):
            out.append({"role": message[0], "parts": [{"type": "text", "content": message[1]}]})
        elif "parts" in message:
            out.append(message)
        else:
            parts = [{"type": "text", "content": str(message.get("content", ""))}]
            out.append({**{k: v for k, v in message.items() if k != "content"}, "parts": parts})
    return to_json(out)


class Step:
    """Handle on the span of a running step: record its output, usage and result."""

    def __init__(self, span: trace.Span, tool: ToolCall | None = None) -> None:
        self.span = span
        self._tool = tool

    def set(self, key: str, value: AttrValue | Sequence[str] | None) -> bool:
        """Set an attribute unless the span already has it; True when it was set."""
        return bool(set_if_absent(self.span, key, value))

    def set_input(self, messages: Sequence[Message]) -> None:
        """Record the input messages (``gen_ai.input.messages``)."""
        if setup.capture_content():
            self.set("gen_ai.input.messages", messages_json(messages))

    def set_output(self, text: str | Sequence[Message], finish_reason: str | None = None) -> None:
        """Record the reply (``gen_ai.output.messages``) and its finish reason."""
        msgs: Sequence[Message] = [("assistant", text)] if isinstance(text, str) else text
        if setup.capture_content():
            self.set("gen_ai.output.messages", messages_json(msgs, default_role="assistant"))
        if finish_reason is not None:
            self.set("gen_ai.response.finish_reasons", [finish_reason])

    def set_usage(self, input_tokens: int | None = None, output_tokens: int | None = None) -> None:
        """Record token usage (``gen_ai.usage.input_tokens`` / ``output_tokens``)."""
        self.set("gen_ai.usage.input_tokens", input_tokens)
        self.set("gen_ai.usage.output_tokens", output_tokens)

    def set_result(self, result: object) -> None:
        """Record a tool's result (``gen_ai.tool.call.result``, JSON)."""
        if setup.capture_content():
            self.set("gen_ai.tool.call.result", result if isinstance(result, str) else to_json(result))

    def run(self, fn: Callable[..., R], *args: Any, **kwargs: Any) -> R:
        """Run a tool's function, or, in a replay with recorded tools, return the recorded result.

        The call is looked up by the step's tool name and its ``arguments`` (else ``kwargs``); see
        ``tracedag.instrument.recorded``. Outside a tool step, or with nothing recorded, ``fn`` runs.
        """
        if self._tool is not None:
            name, arguments = self._tool
            served = recorded.serve(self.span, name, arguments if arguments is not None else kwargs)
            if served is not recorded.MISSING:
                return served  # type: ignore[no-any-return]
        return fn(*args, **kwargs)

    def fail(self, kind: str, message: str = "") -> None:
        """Mark the step failed without an exception (e.g. a tool that returned an error)."""
        self.set("error.type", kind)
        self.span.set_status(Status(StatusCode.ERROR, message or kind))


def _record_exception(span: trace.Span, exc: BaseException) -> None:
    set_if_absent(span, "error.type", error_type(exc))
    span.record_exception(exc)
    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))


class StepSpec:
    """One kind of step, usable as ``with spec as step:`` and as ``@spec`` on a function."""

    def __init__(
        self,
        span_name: str,
        attributes: Attrs,
        *,
        new_span: bool = True,
        on_call: Callable[[Step, Mapping[str, Any]], None] | None = None,
        on_return: Callable[[Step, object], None] | None = None,
        is_node: bool = False,
        opens_chain: bool = False,
        tool: ToolCall | None = None,
    ) -> None:
        self.span_name = span_name
        self.attributes = {k: v for k, v in attributes.items() if v is not None}
        self.new_span = new_span
        self.on_call = on_call
        self.on_return = on_return
        self.is_node = is_node
        self.opens_chain = opens_chain
        self.tool = tool  # (tool name, arguments): served from a recording in replays
        self._local = threading.local()  # open blocks per thread, so one spec may be shared

    def _stack(self) -> list[AbstractContextManager[Step]]:
        stack: list[AbstractContextManager[Step]] | None = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def __enter__(self) -> Step:
        cm = self._open()
        step = cm.__enter__()
        self._stack().append(cm)
        return step

    def __exit__(self, *exc_info: Any) -> bool | None:
        return self._stack().pop().__exit__(*exc_info)

    @contextmanager
    def _open(self) -> Iterator[Step]:
        if not self.new_span:
            yield from self._annotate_current()
            return
        tracer = setup.tracer()
        with tracer.start_as_current_span(
            self.span_name,
            attributes=self._start_attributes(),
            record_exception=False,
            set_status_on_exception=False,
        ) as span, _node_scope(span, self.is_node, self.is_node or self.opens_chain):
            try:
                yield Step(span, self.tool)
            except BaseException as exc:
                _record_exception(span, exc)
                raise

    def _annotate_current(self) -> Iterator[Step]:
        span = trace.get_current_span()
        for key, value in self.attributes.items():
            set_if_absent(span, key, value)
        try:
            yield Step(span, self.tool)
        except BaseException as exc:
            _record_exception(span, exc)
            raise

    def _start_attributes(self) -> dict[str, Any]:
        attrs: dict[str, Any] = dict(self.attributes)
        if self.is_node:
            chain = otel_context.get_value(_CHAIN_KEY)
            attrs["gen_ai.node.execution.id"] = uuid.uuid4().hex[:16]
            if isinstance(chain, _NodeChain) and chain.last is not None:
                attrs["gen_ai.node.previous_execution.id"] = [chain.last]
        return attrs

    def __call__(self, fn: Callable[P, R]) -> Callable[P, R]:
        """Decorate ``fn`` (plain or ``async``) so each call runs inside its own step span."""
        signature = inspect.signature(fn)
        if inspect.iscoroutinefunction(fn):
            return self._wrap_async(fn, signature)

        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            with self._open() as step:
                bound = self._called(step, signature, args, kwargs)
                served = self._serve(step, bound)
                result = fn(*args, **kwargs) if served is recorded.MISSING else served
                if self.on_return is not None:
                    self.on_return(step, result)
                return result

        return wrapper

    def _wrap_async(self, fn: Callable[..., Any], signature: inspect.Signature) -> Callable[..., Any]:
        @functools.wraps(fn)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self._open() as step:
                bound = self._called(step, signature, args, kwargs)
                served = self._serve(step, bound)
                result = await fn(*args, **kwargs) if served is recorded.MISSING else served
                if self.on_return is not None:
                    self.on_return(step, result)
                return result

        return wrapper

    def _called(self, step: Step, signature: inspect.Signature, args: Any, kwargs: Any) -> dict[str, Any]:
        bound = dict(signature.bind_partial(*args, **kwargs).arguments)
        if self.on_call is not None:
            self.on_call(step, bound)
        return bound

    def _serve(self, step: Step, bound: Mapping[str, Any]) -> Any:
        """The recorded result of a tool call in a replay with recorded tools, else ``MISSING``."""
        if self.tool is None:
            return recorded.MISSING
        name, arguments = self.tool
        return recorded.serve(step.span, name, arguments if arguments is not None else bound)


class _NodeChain:
    """The last node execution id under one agent span (for ``gen_ai.node.previous_execution.id``)."""

    def __init__(self) -> None:
        self.last: str | None = None


@contextmanager
def _node_scope(span: trace.Span, is_node: bool, opens_chain: bool) -> Iterator[None]:
    """A node appends itself to the chain it runs in; agents and nodes open a chain for their children."""
    if is_node:
        chain = otel_context.get_value(_CHAIN_KEY)
        execution_id = (getattr(span, "attributes", None) or {}).get("gen_ai.node.execution.id")
        if isinstance(chain, _NodeChain) and execution_id is not None:
            chain.last = str(execution_id)
    if not opens_chain:
        yield
        return
    token = otel_context.attach(otel_context.set_value(_CHAIN_KEY, _NodeChain()))
    try:
        yield
    finally:
        otel_context.detach(token)
