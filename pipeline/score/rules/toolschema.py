"""Tool definitions found in a trace, the tool calls a model step emitted, and validation of a
tool call's arguments against the definitions.

Definitions the model was given (``DEFINITION_KEYS``): ``gen_ai.tool.definitions`` (a JSON array;
OTel GenAI form ``{"type": "function", "name", "parameters"}`` or OpenAI form ``{"type":
"function", "function": {"name", "parameters"}}``; pydantic-ai), OpenInference
``llm.tools.N.tool.json_schema`` and ``tool.json_schema`` (one OpenAI-form tool each; smolagents,
LlamaIndex). A tool span's own parameters schema (``BARE_SCHEMA_KEYS``: OpenInference
``tool.parameters``, LlamaIndex; Strands' ``gen_ai.tool.json_schema``) is named by the span's
``tool.name`` / ``gen_ai.tool.name`` and counts only for a tool no definition names, and only when
it is a JSON schema (smolagents' ``tool.parameters`` is its own ``{"arg": {"type": "any"}}`` map).
The tool's description (a definition's ``description``; beside a bare schema, OpenInference
``tool.description`` or GenAI ``gen_ai.tool.description``) is kept as the schema's top-level
``description`` when the schema has none, for the formats it states (``format_hints``).

The calls a model step emitted (``emitted_calls``): OpenInference
``llm.output_messages.I.message.tool_calls.J.tool_call.{id,function.name,function.arguments}``,
OTel GenAI ``gen_ai.output.messages`` parts ``{"type": "tool_call", "id", "name", "arguments"}``
and indexed ``gen_ai.completion.I.tool_calls.J.{id,name,arguments}``.
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


BARE_SCHEMA_KEYS = ("tool.parameters", "gen_ai.tool.json_schema")
"""Attribute keys of a tool span holding its parameters schema alone (named by ``TOOL_NAME_KEYS``)."""

TOOL_NAME_KEYS = ("tool.name", "gen_ai.tool.name")

TOOL_DESCRIPTION_KEYS = ("tool.description", "gen_ai.tool.description")

Entries = Sequence[tuple[str, "str | None"]]
"""The (key, value) attribute entries of one span."""


def is_definition_key(key: str) -> bool:
    """True when an attribute key carries tool definitions."""
    return key in DEFINITION_KEYS or (key.startswith("llm.tools.") and key.endswith(".tool.json_schema"))


def span_definitions(entries: Entries) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """(the definitions a span gave the model, its tool's own parameters schema) from its entries."""
    given: dict[str, dict[str, Any]] = {}
    bare: dict[str, dict[str, Any]] = {}
    names = [v for k, v in entries if k in TOOL_NAME_KEYS and v]
    about = next((v for k, v in entries if k in TOOL_DESCRIPTION_KEYS and v), None)
    for key, value in entries:
        if not value:
            continue
        if is_definition_key(key):
            given.update(parse_definitions(value))
        elif key in BARE_SCHEMA_KEYS and names:
            schema = _bare_schema(value)
            if schema is not None:
                bare[names[0]] = _described(schema, about)
    return given, bare


def _described(schema: dict[str, Any], description: Any) -> dict[str, Any]:
    """``schema`` with the tool's ``description`` as its own, when it has none."""
    if not isinstance(description, str) or not description.strip() or "description" in schema:
        return schema
    return {**schema, "description": description}


def _bare_schema(value: str) -> dict[str, Any] | None:
    """``value`` as a JSON schema of an object's parameters, None when it is not one."""
    try:
        doc = json.loads(value)
    except ValueError:
        return None
    if not isinstance(doc, dict) or not (doc.get("type") == "object" or isinstance(doc.get("properties"), dict)):
        return None
    return doc if _validator(doc) is not None else None


def _one_tool(obj: Any) -> tuple[str, dict[str, Any]] | None:
    if not isinstance(obj, dict):
        return None
    fn = obj.get("function")
    inner: dict[str, Any] = fn if isinstance(fn, dict) else obj
    name = inner.get("name")
    params = inner.get("parameters", inner.get("input_schema"))
    if isinstance(name, str) and isinstance(params, dict):
        return name, _described(params, inner.get("description"))
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

    kind: str  # not_json | unknown_field | schema | format (rules.args_problem, format_hints)
    detail: str


@dataclass(frozen=True)
class EmittedCall:
    """A tool call in a model step's output: the tool's name, its arguments as written (JSON text;
    None when the span does not record them) and its call id."""

    name: str
    arguments: str | None
    call_id: str | None = None


_OI_CALL = re.compile(r"^llm\.output_messages\.(\d+)\.message\.tool_calls\.(\d+)\.tool_call\."
                      r"(id|function\.name|function\.arguments)$")
_INDEXED_CALL = re.compile(r"^gen_ai\.completion\.(\d+)\.tool_calls\.(\d+)\.(id|name|arguments)$")
_CALL_FIELD = {"id": "id", "name": "name", "function.name": "name", "arguments": "arguments",
               "function.arguments": "arguments"}
OUTPUT_MESSAGES_KEY = "gen_ai.output.messages"


def emitted_calls(entries: Entries) -> list[EmittedCall]:
    """The tool calls in a model step's output, from its attribute entries (every dialect above)."""
    out: list[EmittedCall] = []
    slots: dict[tuple[int, int, int], dict[str, str]] = {}
    for key, value in entries:
        if value is None:
            continue
        if key == OUTPUT_MESSAGES_KEY:
            out.extend(_genai_calls(value))
            continue
        for dialect, rx in enumerate((_OI_CALL, _INDEXED_CALL)):
            found = rx.match(key)
            if found:
                slots.setdefault((dialect, int(found[1]), int(found[2])), {})[_CALL_FIELD[found[3]]] = value
    out += [EmittedCall(f["name"], f.get("arguments"), f.get("id")) for _, f in sorted(slots.items()) if f.get("name")]
    return out


def _genai_calls(text: str) -> list[EmittedCall]:
    try:
        doc = json.loads(text)
    except ValueError:
        return []
    calls: list[EmittedCall] = []
    for msg in doc if isinstance(doc, list) else [doc]:
        parts = msg.get("parts") if isinstance(msg, dict) else None
        for part in parts if isinstance(parts, list) else []:
            if not (isinstance(part, dict) and part.get("type") == "tool_call" and isinstance(part.get("name"), str)):
                continue
            args = part.get("arguments")
            text_args = args if isinstance(args, str) or args is None else json.dumps(args)
            call_id = part.get("id")
            calls.append(EmittedCall(part["name"], text_args, str(call_id) if call_id is not None else None))
    return calls


def call_problem(call: EmittedCall, schema: dict[str, Any]) -> ArgsProblem | None:
    """Why an emitted call's arguments do not fit its tool's schema (None: they fit, or were not recorded)."""
    args, problem = parse_arguments(call.arguments, None)
    if problem is not None or args is None:
        return problem
    return check_arguments(args, schema)


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
