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

from tracedag.pipeline.normalize import payloads as normalize_json
from tracedag.pipeline.normalize.extract import (
    Entries,
    Sparse,
    family,
    scatter,
    string_offsets,
    true_mask,
    valid_mask,
)

logger = logging.getLogger(__name__)

TEXT_CAP = 8192
_PARSE_LIMIT = normalize_json.PARSE_LIMIT  # larger JSON payloads are kept as raw (capped) text, unparsed
_INDEXED = r"^{p}\.(?P<idx>\d+)\.(?P<field>{f})$"
# First character of a text that cannot be JSON (nor whitespace, which str.strip removes): the
# text is then its own readable form for every reducer.
_PLAIN = r'^[^\[{"\s\x0b\x1c-\x1f\x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000}]'

Loads = Callable[[str], Any]
Reducer = Callable[[str, Loads], str | None]



def _orjson() -> Loads | None:
    try:
        import orjson
    except ImportError:  # optional: the standard json module gives the same objects, slower
        return None
    loads: Loads = orjson.loads
    return loads


_orjson_loads = _orjson()
# json.dumps(v, ensure_ascii=False[, sort_keys=True]) builds an encoder per call; these are reused.
_dumps = json.JSONEncoder(ensure_ascii=False).encode
_dumps_sorted = json.JSONEncoder(ensure_ascii=False, sort_keys=True).encode


class Assembly:
    """A text column built from sources in priority order: each row keeps the first text it is given.

    Pieces are kept as (rows, texts) and the column is built once, by one ``take`` at the end,
    instead of rewriting the whole column for every source.
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self.filled = np.zeros(n, dtype=bool)
        self.rows: list[np.ndarray] = []
        self.texts: list[pa.Array] = []

    def add(self, rows: np.ndarray, texts: pa.Array) -> None:
        """Texts for ``rows`` (none filled yet); a null text leaves its row to later sources."""
        ok = valid_mask(texts)
        if not ok.all():
            rows, texts = rows[ok], texts.filter(pa.array(ok))
        if len(rows):
            self.filled[rows] = True
            self.rows.append(rows)
            self.texts.append(texts)

    def coalesce(self, column: pa.Array) -> None:
        """Fill the rows still empty from ``column`` (one value per row, null where it has none)."""
        rows = np.flatnonzero(valid_mask(column) & ~self.filled)
        if len(rows):
            self.add(rows, column.take(pa.array(rows)))

    def needed(self, source: Sparse) -> tuple[np.ndarray, np.ndarray]:
        """Rows of ``source`` still empty, and their positions in the entry values."""
        free = ~self.filled[source.rows]
        return source.rows[free], source.pos[free]

    def column(self) -> pa.Array:
        """The assembled column (null where no source gave a text)."""
        if not self.rows:
            return pa.nulls(self.n, pa.string())
        texts = pa.concat_arrays(self.texts) if len(self.texts) > 1 else self.texts[0]
        return scatter(texts, np.concatenate(self.rows), self.n)


Filler = Callable[[Assembly, Sparse, pa.Array, Reducer], None]


def fill(into: Assembly, source: Sparse, values: pa.Array, fn: Reducer) -> None:
    """Give the empty rows of ``into`` ``fn`` applied to ``source`` (entries of ``values``), only where needed.

    Equal to ``fill_reference``, faster: only the needed payloads are gathered, text that cannot
    be JSON is its own readable form, known JSON shapes are reduced by Arrow kernels
    (``reduce_column``), each other distinct payload once in Python with ``loads_fast``.
    """
    rows, pos = into.needed(source)
    if len(rows):
        into.add(rows, reduce_column(values.take(pa.array(pos)), fn))


def fill_reference(into: Assembly, source: Sparse, values: pa.Array, fn: Reducer) -> None:
    """The straightforward ``fill``: ``fn`` on every needed row with the standard ``json`` module (the oracle)."""
    rows, pos = into.needed(source)
    if len(rows):
        into.add(rows, pa.array([fn(s, json.loads) for s in values.take(pa.array(pos)).to_pylist()], pa.string()))


def reduce_column(values: pa.Array, fn: Reducer) -> pa.Array:
    """``fn`` over ``values`` (nulls stay null), equal to the per-row loop.

    Plain text is kept as is; JSON of the shapes ``normalize_json`` recognises is reduced with
    Arrow kernels; each remaining distinct value is reduced once in Python.
    """
    plain = _plain(values)
    if plain.all():
        return values
    out, pending = values, ~plain
    fast = normalize_json.FAST_PATHS.get(fn.__name__)
    if fast is not None:
        texts, done = fast(values)  # its shapes start with [ or {: never plain, never null
        if done.all():
            return texts
        if done.any():
            out = pc.replace_with_mask(out, pa.array(done), texts)
            pending &= ~done
    if not pending.any():
        return out
    todo = values.take(pa.array(np.flatnonzero(pending)))
    return pc.replace_with_mask(out, pa.array(pending), _reduce_distinct(todo, fn))


# first bytes that make a text possibly JSON: [ { " and what str.strip / RE2 \\s remove
_MAYBE_JSON = np.zeros(256, dtype=bool)
_MAYBE_JSON[[ord(c) for c in '[{"\t\n\x0b\x0c\r \x1c\x1d\x1e\x1f']] = True


def _plain(values: pa.Array) -> np.ndarray:
    """Per row, whether the text cannot be JSON (``_PLAIN`` matches; null rows count as plain).

    Read from the first byte of each text; only texts starting with a non-ASCII character (a
    Unicode space is possible) are matched with ``_PLAIN``.
    """
    offsets = string_offsets(values)
    nonempty = np.diff(offsets) > 0
    first = np.zeros(len(values), dtype=np.uint8)
    if nonempty.any():
        first[nonempty] = np.frombuffer(values.buffers()[2], dtype=np.uint8)[offsets[:-1][nonempty]]
    plain = nonempty & ~_MAYBE_JSON[first]
    wide = np.flatnonzero(nonempty & (first >= 0x80))
    if len(wide):
        plain[wide] = true_mask(pc.match_substring_regex(values.take(pa.array(wide)), _PLAIN))
    out: np.ndarray = plain | ~valid_mask(values)
    return out


def _reduce_distinct(todo: pa.Array, fn: Reducer) -> pa.Array:
    """``fn`` once per distinct value (orjson unless the text holds an integer beyond 64 bits)."""
    distinct = pc.unique(todo)
    big = pc.fill_null(pc.match_substring_regex(distinct, r"\d{19}"), False).to_pylist()
    texts = [fn(s, json.loads if b else loads_fast) for s, b in zip(distinct.to_pylist(), big, strict=True)]
    return pa.array(texts, pa.string()).take(pc.index_in(todo, value_set=distinct))


def loads_fast(text: str) -> Any:
    """``json.loads(text)`` through orjson when installed (stdlib on anything orjson rejects).

    orjson and ``json`` give equal objects except for integers beyond 64 bits (orjson makes them
    floats): callers pass text with a run of 19+ digits to ``json.loads`` instead.
    """
    if _orjson_loads is not None:
        try:
            return _orjson_loads(text)
        except ValueError:
            pass
    return json.loads(text)


def _load(text: str, loads: Loads) -> Any:
    s = text.strip()
    if not s or s[0] not in "[{\"" or len(s) > _PARSE_LIMIT:
        return text
    try:
        return loads(s)
    except (ValueError, RecursionError):
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
            return _readable(p.get("response", p.get("result")), json.loads)
    return None


def _call_text(name: Any, args: Any) -> str:
    if not isinstance(args, str):
        args = _dumps_sorted(args)
    return f"{name}({args})"


def genai_input(text: str, loads: Loads = json.loads) -> str | None:
    """The last user message of a ``gen_ai.input.messages`` JSON list (else the last message)."""
    msgs = _load(text, loads)
    if not isinstance(msgs, list) or not msgs:
        return text
    users = [m for m in msgs if isinstance(m, dict) and m.get("role") == "user"]
    last = (users or [m for m in msgs if isinstance(m, dict)] or [{}])[-1]
    return _parts_text(last.get("parts", last.get("content")))


def genai_output(text: str, loads: Loads = json.loads) -> str | None:
    """The assistant reply (text, else tool calls) of a ``gen_ai.output.messages`` JSON list."""
    msgs = _load(text, loads)
    if not isinstance(msgs, list) or not msgs:
        return text
    found = [_parts_text(m.get("parts", m.get("content"))) for m in msgs if isinstance(m, dict)]
    out = [t for t in found if t]
    return "\n".join(out) if out else None


def readable(text: str, loads: Loads = json.loads) -> str | None:
    """A readable form of an ``input.value``/``output.value``/entity payload (JSON reduced to its text)."""
    return _readable(_load(text, loads), loads)


_WRAPPERS = ("input_str", "inputs", "outputs", "output", "input", "args", "kwargs", "data", "messages")


def _readable(v: Any, loads: Loads, depth: int = 0) -> str | None:
    if v is None:
        return None
    if isinstance(v, str):
        return v
    if depth > 6:
        return _dumps(v)
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
                return _readable(_load(inner, loads) if isinstance(inner, str) and key == "input_str" else inner, loads, depth + 1)
        if len(v) == 1 and isinstance(next(iter(v.values())), list | dict):
            return _readable(next(iter(v.values())), loads, depth + 1)
        return _dumps(v)
    if isinstance(v, list):
        if v and all(isinstance(x, dict) for x in v):
            return _readable(v[-1], loads, depth + 1)
        return _dumps(v)
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
    fam = family(entries, prefix, pat)
    fam = fam.filter(pc.equal(fam["idx"], 0)) if fam.num_rows else fam
    names = _pick_message(fam, entries.n, None, "name", None)
    args = _pick_message(fam, entries.n, None, "arguments", None)
    joined = pc.binary_join_element_wise(names, pc.fill_null(args, ""), "(")
    return pc.binary_join_element_wise(joined, pa.scalar(")"), "")


def cap(text: pa.Array) -> tuple[pa.Array, pa.Array]:
    """Cut texts longer than ``TEXT_CAP`` characters; return (texts, was_cut).

    Only texts of more than ``TEXT_CAP`` bytes can be that long, so characters are counted
    for those alone.
    """
    maybe = true_mask(pc.greater(pc.binary_length(text), TEXT_CAP))
    long = np.zeros(len(text), dtype=bool)
    if maybe.any():
        rows = np.flatnonzero(maybe)
        some = text.take(pa.array(rows))
        long[rows] = np.asarray(pc.greater(pc.utf8_length(some), TEXT_CAP), dtype=bool)
    if not long.any():
        return text, pa.array(long)
    rows = np.flatnonzero(long)
    cut = pc.utf8_slice_codeunits(text.take(pa.array(rows)), 0, TEXT_CAP)
    return pc.replace_with_mask(text, pa.array(long), cut), pa.array(long)
