"""Canonical text of tool-call arguments, so equal calls compare equal across runs.

Rules: the arguments text is parsed as JSON (or, failing that, as a Python literal such as
``{'q': 'x'}``, which some instrumentations write); object keys are sorted; numbers that are whole
(``1``, ``1.0``, ``1e0``) become integers and other floats use their shortest repr; strings are
stripped and inner whitespace runs become one space; the result is compact JSON. Text that parses
as neither is stripped and whitespace-collapsed. ``None`` and empty text give ``""``.
"""

from __future__ import annotations

import ast
import functools
import json
import math
from typing import Any


def _collapse(text: str) -> str:
    """Strip and turn inner whitespace runs into one space (``str.split`` and ``\\s`` agree on
    what whitespace is; split is several times faster than the regular expression)."""
    return " ".join(text.split())


def _norm(value: Any) -> Any:
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if math.isfinite(value) and value == int(value):
            return int(value)
        return value
    if isinstance(value, str):
        return _collapse(value)
    if isinstance(value, dict):
        return {str(k): _norm(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, list | tuple):
        return [_norm(v) for v in value]
    return _collapse(str(value))


def _parse(text: str) -> tuple[bool, Any]:
    try:
        return True, json.loads(text)
    except ValueError:
        pass
    try:
        return True, ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False, None


_ENVELOPE_KEYS = {"input_str", "inputs", "tags", "metadata", "kwargs"}


def _unwrap(value: Any) -> tuple[bool, Any]:
    """The arguments inside a LangChain callback envelope (see the module docstring)."""
    if not isinstance(value, dict) or not ({"inputs", "input_str"} & set(value)):
        return True, value
    if not set(value) <= _ENVELOPE_KEYS:
        return True, value
    if value.get("inputs") not in (None, {}, ""):
        return True, value["inputs"]
    inner = value.get("input_str")
    return _parse(inner.strip()) if isinstance(inner, str) else (True, inner)


@functools.lru_cache(maxsize=65536)
def canonical_args(text: str | None) -> str:
    """Return the canonical form of an arguments text (see the module docstring); cached."""
    if text is None or not text.strip():
        return ""
    ok, value = _parse(text.strip())
    if ok:
        ok, value = _unwrap(value)
    if not ok:
        return _collapse(text)
    if isinstance(value, str):
        return json.dumps(_norm(value), ensure_ascii=False)
    return json.dumps(_norm(value), separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def action_with_input(tool: str, args: str | None) -> str:
    """The action+input token of a tool call: ``name(canonical arguments)``."""
    return f"{tool}({canonical_args(args)})"
