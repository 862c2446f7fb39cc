"""Recorded tool results: in a replay, a tool call can return what the source trace recorded.

``tracedag replay --tools recorded`` runs each conversation inside ``recorded_tools(recording)``.
There, a ``tool`` step run as a decorator, or through ``Step.run(fn, ...)`` in a ``with td.tool(...)``
block, looks its tool name and arguments (compared as canonical JSON) up in the recording: a match
returns the recorded result (JSON-decoded when it is JSON) without calling the tool, or raises
:class:`RecordedToolError` when the recorded call failed; the span gets ``tracedag.tool.recorded =
true``. Several recorded calls with the same name and arguments are served in their order, the
last one again once they are used up. A call with no match runs the tool (``unmatched="live"``)
or raises :class:`UnmatchedToolCall` (``"fail"``). Outside ``recorded_tools`` tools always run.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from opentelemetry import context as otel_context
from opentelemetry import trace

RECORDED_ATTRIBUTE = "tracedag.tool.recorded"
_KEY = otel_context.create_key("tracedag.tool_recording")
MISSING: Any = object()
"""``serve`` found nothing to serve: run the tool."""


class RecordedToolError(Exception):
    """The recorded call failed; raised in its place with the recorded error type and message."""

    def __init__(self, tool: str, error_type: str, message: str) -> None:
        super().__init__(f"{tool}: {message or error_type} (recorded)")
        self.tool = tool
        self.error_type = error_type


class UnmatchedToolCall(Exception):
    """No recorded call has this tool name and these arguments (``--unmatched fail``)."""


@dataclass(frozen=True)
class RecordedCall:
    """One tool call of the source trace."""

    name: str
    arguments: str | None
    result: str | None = None
    error_type: str | None = None
    error_message: str = ""


def canonical(arguments: object) -> str:
    """Arguments as canonical JSON text (a JSON string is parsed first; other text stays as it is)."""
    if isinstance(arguments, str):
        try:
            parsed: object = json.loads(arguments)
        except ValueError:
            return arguments.strip()
        arguments = parsed
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), default=str, ensure_ascii=False)


class ToolRecording:
    """The recorded calls of one run, served by tool name and canonical arguments (thread-safe)."""

    def __init__(self, calls: Iterable[RecordedCall], unmatched: Literal["live", "fail"] = "live") -> None:
        self.unmatched = unmatched
        self._calls: dict[tuple[str, str], list[RecordedCall]] = {}
        for call in calls:
            self._calls.setdefault((call.name, canonical(call.arguments or {})), []).append(call)
        self._next: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()
        self.served = 0
        self.live = 0
        self.failed = 0

    def lookup(self, name: str, arguments: object) -> RecordedCall | None:
        """The next recorded call for ``name`` and ``arguments``, or None (counted as served / unmatched)."""
        key = (name, canonical(arguments if arguments is not None else {}))
        with self._lock:
            calls = self._calls.get(key)
            if not calls:
                if self.unmatched == "fail":
                    self.failed += 1
                else:
                    self.live += 1
                return None
            i = self._next.get(key, 0)
            self._next[key] = i + 1
            self.served += 1
            return calls[min(i, len(calls) - 1)]


PROXY_HEADER = "X-Tracedag-Model-Base-URL"
"""The request header carrying, per run, the base URL of ``tracedag confirm``'s model proxy (an agent behind
a URL sends its model calls there and asks ``<base>/tracedag/tools`` before running a tool)."""


class ProxiedToolRecording(ToolRecording):
    """The recording of a run held by ``tracedag confirm``'s proxy, asked over HTTP at ``<base_url>/tracedag/tools``.

    An agent behind a URL serves a request that carries :data:`PROXY_HEADER` inside
    ``recorded_tools(ProxiedToolRecording(base_url))``: its ``tool`` steps then return what the proxy
    serves (the recorded calls before the root cause, the root call's replacement) and run the others.
    """

    def __init__(self, base_url: str, timeout: float = 30.0) -> None:
        super().__init__(())
        self.url = base_url.rstrip("/") + "/tracedag/tools"
        self.timeout = timeout

    def lookup(self, name: str, arguments: object) -> RecordedCall | None:
        """Ask the proxy for the call; None when it has nothing recorded for it (the tool runs)."""
        body = json.dumps({"name": name, "arguments": canonical(arguments if arguments is not None else {})})
        request = urllib.request.Request(self.url, data=body.encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            answer = json.loads(response.read())
        with self._lock:
            if not answer.get("served"):
                self.live += 1
                return None
            self.served += 1
        return RecordedCall(name, None, answer.get("result"), answer.get("error_type"),
                            str(answer.get("error_message") or ""))


def current() -> ToolRecording | None:
    """The recording of the current context, if any."""
    value = otel_context.get_value(_KEY)
    return value if isinstance(value, ToolRecording) else None


@contextmanager
def recorded_tools(recording: ToolRecording) -> Iterator[ToolRecording]:
    """Tool steps started inside serve from ``recording``."""
    token = otel_context.attach(otel_context.set_value(_KEY, recording))
    try:
        yield recording
    finally:
        otel_context.detach(token)


def serve(span: trace.Span, name: str | None, arguments: Mapping[str, Any] | str | None) -> Any:
    """The recorded result for this call, ``MISSING`` to run the tool; raises for a recorded failure
    or an unmatched call under ``unmatched="fail"``."""
    recording = current()
    if recording is None or name is None:
        return MISSING
    call = recording.lookup(name, arguments)
    if call is None:
        if recording.unmatched == "fail":
            raise UnmatchedToolCall(f"{name}: no recorded call with arguments {canonical(arguments or {})}")
        return MISSING
    if span.is_recording():
        span.set_attribute(RECORDED_ATTRIBUTE, True)
    if call.error_type is not None:
        if span.is_recording():
            span.set_attribute("error.type", call.error_type)
        raise RecordedToolError(name, call.error_type, call.error_message)
    if call.result is None:
        return None
    try:
        return json.loads(call.result)
    except ValueError:
        return call.result
