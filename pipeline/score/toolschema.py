"""Tool definitions found in a trace, and validation of a tool call's arguments against them.

Definitions come from ``gen_ai.tool.definitions`` (a JSON array; OTel GenAI form
``{"type": "function", "name", "parameters"}`` or OpenAI form ``{"type": "function",
"function": {"name", "parameters"}}``), OpenInference ``llm.tools.N.tool.json_schema`` and
``tool.json_schema`` (one OpenAI-form tool each).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jsonschema

logger = logging.getLogger(__name__)

DEFINITION_KEYS = ("gen_ai.tool.definitions", "tool.json_schema")
"""Attribute keys holding tool definitions (plus every ``llm.tools.N.tool.json_schema``)."""


def is_definition_key(key: str) -> bool:
    """True when an attribute key carries tool definitions."""
    return key in DEFINITION_KEYS or (key.startswith("llm.tools.") and key.endswith(".tool.json_schema"))


def _one_tool(obj: Any) -> tuple[str, dict[str, Any]] | None:
    if not isinstance(obj, dict):
        return None
    fn = obj.get("function")
    inner: dict[str, Any] = fn if isinstance(fn, dict) else obj
    name = inner.get("name")
    params = inner.get("parameters", inner.get("input_schema"))
    if isinstance(name, str) and isinstance(params, dict):
        return name, params
    return None


def parse_definitions(value: str) -> dict[str, dict[str, Any]]:
    """Return ``{tool name: JSON schema of its parameters}`` from one attribute value."""
    try:
        doc = json.loads(value)
    except (TypeError, ValueError):
        logger.debug("tool definition is not JSON: %.80s", value)
        return {}
    items = doc if isinstance(doc, list) else [doc]
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        found = _one_tool(item)
        if found:
            out[found[0]] = found[1]
    return out


@dataclass(frozen=True)
class ArgsProblem:
    """Why a tool call's arguments do not fit the tool's schema."""

    kind: str  # not_json | unknown_field | schema
    detail: str


def parse_arguments(explicit: str | None, input_text: str | None) -> tuple[Any, ArgsProblem | None]:
    """Return the arguments object, or an ``ArgsProblem`` when the explicit arguments are not JSON.

    ``explicit`` is an attribute meant to hold JSON (``gen_ai.tool.call.arguments``); the step's
    ``input_text`` is used only when it happens to be a JSON object.
    """
    if explicit is not None and explicit.strip():
        try:
            return json.loads(explicit), None
        except json.JSONDecodeError as e:
            return None, ArgsProblem("not_json", f"arguments are not JSON ({e.msg} at char {e.pos})")
    if input_text:
        try:
            value = json.loads(input_text)
        except ValueError:
            return None, None
        return (value if isinstance(value, dict) else None), None
    return None, None


def _orjson_loads() -> Callable[[str], Any] | None:
    try:
        import orjson
    except ImportError:  # optional: json alone gives the same answers, slower
        return None
    loads: Callable[[str], Any] = orjson.loads
    return loads


_fast_loads = _orjson_loads()
_LONG_DIGITS = re.compile(r"\d{4000}")


def arguments_are_json(explicit: str | None) -> bool:
    """False exactly when ``parse_arguments(explicit, ...)`` reports ``not_json``.

    orjson (when installed) accepts a subset of what ``json.loads`` accepts, except for documents
    ``json.loads`` raises on without a ``JSONDecodeError`` (nesting past the recursion limit,
    integers over 4300 digits): those, and whatever orjson rejects, go to ``json.loads``.
    """
    if explicit is None or not explicit.strip():
        return True
    if _fast_loads is not None and _orjson_agrees(explicit):
        try:
            _fast_loads(explicit)
            return True
        except ValueError:
            pass
    try:
        json.loads(explicit)
    except json.JSONDecodeError:
        return False
    return True


def arguments_are_json_all(texts: Sequence[str | None]) -> list[bool]:
    """``arguments_are_json`` of each text; short texts that orjson parses take no further call."""
    loads = _fast_loads
    out = []
    for text in texts:
        if loads is not None and text is not None and len(text) < 400:
            try:
                loads(text)
                out.append(True)
                continue
            except ValueError:
                pass
        out.append(arguments_are_json(text))
    return out


def _orjson_agrees(text: str) -> bool:
    if len(text) < 400:  # a document nested 200 deep has 400 brackets
        return True
    shallow = text.count("[") + text.count("{") < 200
    return shallow and (len(text) < 4000 or not _LONG_DIGITS.search(text))


# id(schema) -> (schema, validator or None when the schema is unusable); holding the schema keeps
# its id from being reused while cached
_VALIDATORS: dict[int, tuple[dict[str, Any], Any]] = {}


def _validator(schema: dict[str, Any]) -> Any:
    hit = _VALIDATORS.get(id(schema))
    if hit is not None and hit[0] is schema:
        return hit[1]
    if len(_VALIDATORS) > 4096:
        _VALIDATORS.clear()
    try:
        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)
        validator = cls(schema)
    except jsonschema.SchemaError as e:
        logger.debug("unusable tool schema: %s", e.message)
        validator = None
    _VALIDATORS[id(schema)] = (schema, validator)
    return validator


def check_arguments(args: Any, schema: dict[str, Any]) -> ArgsProblem | None:
    """Validate ``args`` against ``schema``; unknown fields are reported apart from other errors."""
    validator = _validator(schema)
    if validator is None:
        return None
    errors = sorted(validator.iter_errors(args), key=lambda e: list(e.path))
    if not errors:
        return None
    unknown = [e for e in errors if e.validator == "additionalProperties"]
    first = unknown[0] if unknown else errors[0]
    where = "/".join(str(p) for p in first.path) or "(root)"
    return ArgsProblem("unknown_field" if unknown else "schema", f"{where}: {first.message}")
