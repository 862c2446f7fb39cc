"""The human-readable input and output text of a step.

Sources, first found wins (see ``input_output``): tool arguments/result, GenAI messages JSON
(``gen_ai.input.messages``/``gen_ai.output.messages``), OpenInference flattened messages
(``llm.input_messages.{i}.message.*``), indexed OpenLLMetry/old GenAI ``gen_ai.prompt.{i}.*`` /
``gen_ai.completion.{i}.*``, OpenInference ``input.value``/``output.value``, then
``traceloop.entity.input/output``. JSON payloads are reduced to their readable part (the last
user message, the assistant's reply or tool calls, a tool's content); only the rows still
lacking text are parsed, one source at a time. Texts are capped at ``TEXT_CAP`` characters.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracedag.pipeline.normalize_extract import Entries, family

logger = logging.getLogger(__name__)

TEXT_CAP = 8192
_PARSE_LIMIT = 256 * 1024  # larger JSON payloads are kept as raw (capped) text rather than parsed
_INDEXED = r"^{p}\.(?P<idx>\d+)\.(?P<field>{f})$"


def fill(current: pa.Array, source: pa.Array, fn: Callable[[str], str | None]) -> pa.Array:
    """Fill the null rows of ``current`` with ``fn`` applied to ``source`` (only where needed)."""
    need = pc.and_(pc.is_null(current), pc.is_valid(source))
    rows = np.flatnonzero(np.asarray(pc.fill_null(need, False), dtype=bool))
    if len(rows) == 0:
        return current
    texts = [fn(s) for s in source.take(pa.array(rows)).to_pylist()]
    patch = np.full(len(current), -1, dtype=np.int64)
    patch[rows] = np.arange(len(rows))
    filled = pa.array(texts, pa.string()).take(pa.array(patch, mask=patch < 0))
    return pc.coalesce(current, filled)


def _load(text: str) -> Any:
    s = text.strip()
    if not s or s[0] not in "[{\"" or len(s) > _PARSE_LIMIT:
        return text
    try:
        return json.loads(s)
    except ValueError:
        return text


def _parts_text(parts: Any) -> str | None:
    """Text of a GenAI message's parts: text parts joined, else tool calls / tool responses."""
    if not isinstance(parts, list):
        return parts if isinstance(parts, str) else None
    texts = [str(p["content"]) for p in parts if isinstance(p, dict) and p.get("type") == "text" and p.get("content")]
    if texts:
        return "\n".join(texts)
    calls = [_call_text(p.get("name"), p.get("arguments")) for p in parts if isinstance(p, dict) and p.get("type") == "tool_call"]
    if calls:
        return "\n".join(calls)
    for p in parts:
        if isinstance(p, dict) and p.get("type") == "tool_call_response":
            return _readable(p.get("response", p.get("result")))
    return None


def _call_text(name: Any, args: Any) -> str:
    if not isinstance(args, str):
        args = json.dumps(args, ensure_ascii=False, sort_keys=True)
    return f"{name}({args})"


def genai_input(text: str) -> str | None:
    """The last user message of a ``gen_ai.input.messages`` JSON list (else the last message)."""
    msgs = _load(text)
    if not isinstance(msgs, list) or not msgs:
        return text
    users = [m for m in msgs if isinstance(m, dict) and m.get("role") == "user"]
    last = (users or [m for m in msgs if isinstance(m, dict)] or [{}])[-1]
    return _parts_text(last.get("parts", last.get("content")))


def genai_output(text: str) -> str | None:
    """The assistant reply (text, else tool calls) of a ``gen_ai.output.messages`` JSON list."""
    msgs = _load(text)
    if not isinstance(msgs, list) or not msgs:
        return text
    found = [_parts_text(m.get("parts", m.get("content"))) for m in msgs if isinstance(m, dict)]
    out = [t for t in found if t]
    return "\n".join(out) if out else None


def readable(text: str) -> str | None:
    """A readable form of an ``input.value``/``output.value``/entity payload (JSON reduced to its text)."""
    return _readable(_load(text))


_WRAPPERS = ("input_str", "inputs", "outputs", "output", "input", "args", "kwargs", "data", "messages")


def _readable(v: Any, depth: int = 0) -> str | None:
    if v is None:
        return None
    if isinstance(v, str):
        return v
    if depth > 6:
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, dict):
        if isinstance(v.get("content"), str) and v.get("content"):
            return str(v["content"])
        calls = v.get("tool_calls")
        if isinstance(calls, list) and calls and all(isinstance(c, dict) for c in calls):
            return "\n".join(_call_text(c.get("name"), c.get("args", c.get("arguments"))) for c in calls)
        for key in _WRAPPERS:
            if key in v and v[key] not in (None, [], {}):
                inner = v[key]
                if key == "args" and isinstance(inner, list) and len(inner) == 1:
                    inner = inner[0]
                return _readable(_load(inner) if isinstance(inner, str) and key == "input_str" else inner, depth + 1)
        if len(v) == 1 and isinstance(next(iter(v.values())), list | dict):
            return _readable(next(iter(v.values())), depth + 1)
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list):
        if v and all(isinstance(x, dict) for x in v):
            return _readable(v[-1], depth + 1)
        return json.dumps(v, ensure_ascii=False)
    return json.dumps(v)


def last_user_message(entries: Entries, prefix: str, fields: str, role_field: str, content_field: str) -> pa.Array:
    """Per row, the content of the highest-indexed ``user`` message of an indexed message family."""
    fam = family(entries, prefix, _INDEXED.format(p=prefix.rstrip(".").replace(".", r"\."), f=fields))
    return _pick_message(fam, entries.n, role_field, content_field, want_role="user")


def last_message(entries: Entries, prefix: str, fields: str, content_field: str) -> pa.Array:
    """Per row, the content of the lowest-indexed message with content in an indexed family."""
    fam = family(entries, prefix, _INDEXED.format(p=prefix.rstrip(".").replace(".", r"\."), f=fields))
    return _pick_message(fam, entries.n, None, content_field, want_role=None)


def _pick_message(fam: pa.Table, n: int, role_field: str | None, content_field: str, want_role: str | None) -> pa.Array:
    from tracedag.pipeline.normalize_extract import scatter

    if fam.num_rows == 0:
        return pa.nulls(n, pa.string())
    content = fam.filter(pc.equal(fam["field"], content_field))
    if want_role is not None and role_field is not None:
        roles = fam.filter(pc.and_(pc.equal(fam["field"], role_field), pc.equal(fam["value"], want_role)))
        last = roles.group_by("row").aggregate([("idx", "max")]).rename_columns(["row", "idx"])
        content = content.join(last, keys=["row", "idx"], join_type="inner")
        content = content.sort_by([("row", "ascending")])
    else:
        content = content.sort_by([("row", "ascending"), ("idx", "descending")])
    rows = np.asarray(content["row"], dtype=np.int64)
    return scatter(content["value"].combine_chunks(), rows, n)


def llm_output_calls(entries: Entries) -> pa.Array:
    """Per row, ``name(arguments)`` of the first tool call in ``llm.output_messages.0``."""
    prefix = "llm.output_messages.0.message.tool_calls."
    pat = r"^llm\.output_messages\.0\.message\.tool_calls\.(?P<idx>\d+)\.tool_call\.function\.(?P<field>name|arguments)$"
    fam = family(entries, prefix, pat).filter(pc.equal(pc.field("idx"), 0))
    names = _pick_message(fam, entries.n, None, "name", None)
    args = _pick_message(fam, entries.n, None, "arguments", None)
    joined = pc.binary_join_element_wise(names, pc.fill_null(args, ""), "(")
    return pc.binary_join_element_wise(joined, pa.scalar(")"), "")


def cap(text: pa.Array) -> tuple[pa.Array, pa.Array]:
    """Cut texts longer than ``TEXT_CAP`` characters; return (texts, was_cut)."""
    long = pc.fill_null(pc.greater(pc.utf8_length(text), TEXT_CAP), False)
    cut = pc.if_else(long, pc.utf8_slice_codeunits(text, 0, TEXT_CAP), text)
    return cut, long
