"""Tool results that say the call failed, although the span's status does not (issue #30 class 2).

Many tools and frameworks answer a failure with a payload instead of raising, so the tool span
ends with status UNSET or OK and only its result tells. ``result_error(text)`` names the first
shape of ``SHAPES`` that a tool's result text matches (None: no error payload). The shapes:

- ``error_key``: a JSON object with a non-empty ``error``, ``errors`` or ``exception`` member
  (``{"error": "order not found"}``, ``{"errors": [...]}``), the common hand-written form;
- ``is_error``: ``"isError": true`` (MCP ``CallToolResult``) or ``"is_error": true`` (Anthropic
  ``tool_result`` blocks);
- ``status_error``: ``"status"`` of ``error``, ``failed`` or ``failure`` (``{"status": "error",
  "message": ...}``);
- ``adk_reflect_retry``: Google ADK's ``ReflectAndRetryToolPlugin`` answer to a failed tool,
  ``{"response_type": "ERROR_HANDLED_BY_REFLECT_AND_RETRY_PLUGIN", "error_type": ...,
  "error_details": ..., "retry_count": ..., "reflection_guidance": ...}``;
- ``error_text``: plain text that starts like an error report (``Error: ...``,
  ``ValueError: ...``, ``Exception: ...``, ``Failed: ...``, a Python traceback).

``error_message(text)`` is what a failing result says about its failure, for the rules that read
error text: the ADK payload's error type and details only (its ``reflection_guidance`` asks the model
generic questions, "are one or more arguments incorrect, badly formatted, or missing?", that no
rule may read as the tool's error), any other result as is.

A JSON object is also read one level down, under the keys frameworks wrap a tool's return value
in (``result``, ``response``, ``output``, ``raw_output``, ``structuredContent``, ``content``), so
ADK's ``{"response": {...}}``, LlamaIndex's ``ToolOutput`` (the tool's own value in ``raw_output``)
and a result wrapped by a framework count the same. A JSON array is never
an error payload (a list of records may hold a record with an ``error`` field). Nothing else is
read: a result that merely mentions an error (``"no errors found"``) passes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

ADK_REFLECT_RETRY = "ERROR_HANDLED_BY_REFLECT_AND_RETRY_PLUGIN"
ERROR_KEYS = ("error", "errors", "exception")
FAILED_STATUSES = ("error", "failed", "failure")
WRAPPER_KEYS = ("result", "response", "output", "raw_output", "structuredContent", "content")
# cheap pre-check: an object without any of these never matches a JSON shape (most results)
KEY_HINTS = ('"error', '"exception', '"isError"', '"is_error"', '"status"', ADK_REFLECT_RETRY)

_ERROR_WORDS = re.compile(
    r"^\s*(error\s*:|exception\s*:|\w+(?:error|exception)\s*:|traceback \(most recent call last\)|failed\s*:)", re.I)


def _error_key(doc: dict[str, Any]) -> bool:
    return any(doc.get(k) for k in ERROR_KEYS)


def _is_error(doc: dict[str, Any]) -> bool:
    return doc.get("isError") is True or doc.get("is_error") is True


def _status_error(doc: dict[str, Any]) -> bool:
    return str(doc.get("status", "")).strip().lower() in FAILED_STATUSES


def _adk_reflect_retry(doc: dict[str, Any]) -> bool:
    return doc.get("response_type") == ADK_REFLECT_RETRY


SHAPES: tuple[tuple[str, Callable[[dict[str, Any]], bool]], ...] = (
    ("adk_reflect_retry", _adk_reflect_retry),
    ("is_error", _is_error),
    ("error_key", _error_key),
    ("status_error", _status_error),
)


def _object(text: str) -> dict[str, Any] | None:
    if text.lstrip()[:1] != "{" or not any(h in text for h in KEY_HINTS):
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _shape_of(doc: dict[str, Any]) -> str | None:
    for name, matches in SHAPES:
        if matches(doc):
            return name
    return None


def result_error(text: str | None) -> str | None:
    """The name of the error shape ``text`` (a tool's result) matches, or None."""
    if not text or not text.strip():
        return None
    doc = _object(text)
    if doc is None:
        return "error_text" if text.lstrip()[:1] not in ("{", "[") and _ERROR_WORDS.match(text) else None
    found = _shape_of(doc)
    if found is not None:
        return found
    inner = [doc[k] for k in WRAPPER_KEYS if isinstance(doc.get(k), dict)]
    return next((s for s in map(_shape_of, inner) if s is not None), None)


def error_message(text: str | None) -> str:
    """What a tool result says about its failure: an ADK reflect-and-retry payload's ``error_type: error_details``
    (the plugin's guidance left out), else ``text`` as is."""
    doc = _object(text or "")
    if doc is None:
        return text or ""
    inner = [doc, *(v for k in WRAPPER_KEYS if isinstance(v := doc.get(k), dict))]
    payload = next((d for d in inner if _adk_reflect_retry(d)), None)
    if payload is None:
        return text or ""
    return f"{payload.get('error_type') or ''}: {payload.get('error_details') or ''}"
