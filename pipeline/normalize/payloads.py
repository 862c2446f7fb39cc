"""Vectorised fast paths for the common JSON payload shapes, equal to the per-row reducers.

Each fast path recognises a strict subset of JSON with an RE2 pattern anchored at both ends, so a
text it accepts is valid JSON whose parse is known without parsing it, and computes the reducer's
result (``normalize_text.genai_input``, ``genai_output``, ``readable``) with Arrow kernels. Texts
outside the subset go to the per-row reducer. The subsets (strings without escapes, separators
as written by compact or default ``json.dumps``):

- GenAI message lists whose messages are ``{"role", "parts"}`` with text parts, the last one a
  user message (``genai_input``: its text);
- a single assistant message with one non-empty text part or one tool call without arguments,
  optionally with ``finish_reason`` (``genai_output``: the text, or ``name(null)``);
- flat objects (scalar or list-of-scalar values, no ``,``/``:`` inside strings, none of the keys
  ``readable`` treats specially, distinct keys, not a single list member), written compact or with
  default ``json.dumps`` separators (``readable``: the object with ``", "`` and ``": "``
  separators, which is what ``json.dumps`` writes).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracedag.pipeline.normalize.byteranges import blob, strings_at
from tracedag.pipeline.normalize.extract import string_offsets, true_mask, valid_mask

logger = logging.getLogger(__name__)

FastPath = Callable[[pa.Array], tuple[pa.Array, np.ndarray]]

PARSE_LIMIT = 256 * 1024  # normalize_text keeps larger payloads as raw text, unparsed

_C = r": ?"
_S = r", ?"
_STR = r'"[^"\\\x00-\x1f]*"'
_NONEMPTY = r'"[^"\\\x00-\x1f]+"'


def _text_part(content: str = _STR) -> str:
    """A ``{"type": "text", "content": ...}`` part, either key order."""
    return (f'(?:\\{{"type"{_C}"text"{_S}"content"{_C}{content}\\}}'
            f'|\\{{"content"{_C}{content}{_S}"type"{_C}"text"\\}})')


_PARTS = f"\\[{_text_part()}(?:{_S}{_text_part()})*\\]"
_MESSAGE = f'\\{{"role"{_C}{_STR}{_S}"parts"{_C}{_PARTS}\\}}'
_LAST_USER = f'\\{{"role"{_C}"user"{_S}"parts"{_C}\\[{_text_part(_NONEMPTY)}\\]\\}}'
GENAI_INPUT = f"^\\[(?:{_MESSAGE}{_S})*{_LAST_USER}\\]$"

_CALL = f'\\{{"type"{_C}"tool_call"{_S}"name"{_C}{_STR}{_S}"id"{_C}{_STR}\\}}'
GENAI_OUTPUT = (f'^\\[\\{{"role"{_C}{_STR}{_S}"parts"{_C}\\[(?:{_text_part(_NONEMPTY)}|{_CALL})\\]'
                f'(?:{_S}"finish_reason"{_C}{_STR})?\\}}\\]$')

_FLAT_STR = r'"[^"\\\x00-\x1f,:]*"'
_SCALAR = f"(?:{_FLAT_STR}|0|-?[1-9][0-9]*|true|false|null)"


def _flat_object(colon: str, comma: str) -> str:
    value = f"(?:{_SCALAR}|\\[\\]|\\[{_SCALAR}(?:{comma}{_SCALAR})*\\])"
    return f"^\\{{(?:{_FLAT_STR}{colon}{value}(?:{comma}{_FLAT_STR}{colon}{value})*)?\\}}$"


FLAT_COMPACT = _flat_object(":", ",")  # separators as json.dumps(separators=(",", ":")) writes them
FLAT_SPACED = _flat_object(": ", ", ")  # as json.dumps writes them by default: the readable form already
SPECIAL_KEYS = pa.array(["content", "tool_calls", "input_str", "inputs", "outputs", "output", "input", "args", "kwargs",
                         "data", "messages"])
"""Keys ``readable`` looks into (content, tool calls, wrappers): objects with one take the per-row path."""


def _matches(values: pa.Array, pattern: str, first: str, last: str, among: np.ndarray | None = None) -> np.ndarray:
    """Rows of ``values`` that match ``pattern``; the regex runs only on the rows (of ``among``) that
    start with ``first`` and end with ``last`` and are within ``PARSE_LIMIT`` (read from the offsets)."""
    ok = _framed(values, ord(first), ord(last))
    if among is not None:
        ok &= among
    if ok.all():  # the usual case: no copy of the candidates
        return true_mask(pc.match_substring_regex(values, pattern))
    rows = np.flatnonzero(ok)
    if len(rows):
        hit = pc.match_substring_regex(values.take(pa.array(rows)), pattern)
        ok[rows] = true_mask(hit)
    return ok


def _framed(values: pa.Array, first: int, last: int) -> np.ndarray:
    """Per row, whether the text starts with byte ``first``, ends with byte ``last`` and is at
    most ``PARSE_LIMIT`` bytes (nulls: no)."""
    offsets = string_offsets(values).astype(np.int64)
    lengths = np.diff(offsets)
    ok = valid_mask(values) & (lengths >= 2) & (lengths <= PARSE_LIMIT)
    data = values.buffers()[2]
    if not ok.any() or data is None:
        return np.zeros(len(values), dtype=bool)
    buf = np.frombuffer(data, dtype=np.uint8)
    at = np.flatnonzero(ok)
    ok[at] = (buf[offsets[at]] == first) & (buf[offsets[at + 1] - 1] == last)
    return ok


class _Quoted:
    """Texts whose strings hold no escaped quote, cut at their ``"``: piece ``k`` of a row lies
    between its quotes ``k - 1`` and ``k`` (as ``split_pattern(values, '"')`` would give it)."""

    def __init__(self, values: pa.Array) -> None:
        self.blob, self.starts, lengths = blob(values)
        self.ends = self.starts + lengths
        self.buf = np.frombuffer(self.blob[0], dtype=np.uint8)
        self.quotes = np.flatnonzero(self.buf == 0x22)
        self.first = np.searchsorted(self.quotes, self.starts)  # each row's first quote
        self.after_last = np.searchsorted(self.quotes, self.ends)  # one past each row's last quote

    def piece(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(start, length) of piece ``k`` >= 1 from the start (each row has more than ``k`` quotes)."""
        start = self.quotes[self.first + k - 1] + 1
        return start, self.quotes[self.first + k] - start

    def piece_from_end(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(start, length) of piece ``k`` >= 1 counted from the end (piece 1 ends at the last quote)."""
        start = self.quotes[self.after_last - k - 1] + 1
        return start, self.quotes[self.after_last - k] - start

    def equals(self, piece: tuple[np.ndarray, np.ndarray], word: bytes) -> np.ndarray:
        """Per row, whether ``piece`` is ``word``."""
        start, length = piece
        same: np.ndarray = length == len(word)
        at = start[same, None] + np.arange(len(word))[None, :]
        same[same] = (self.buf[at] == np.frombuffer(word, dtype=np.uint8)).all(axis=1)
        return same

    def strings(self, piece: tuple[np.ndarray, np.ndarray]) -> pa.Array:
        """The pieces as a ``string`` array."""
        start, length = piece
        return strings_at([self.blob], np.zeros(len(start), dtype=np.int64), start, length)


def genai_input(values: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """``normalize_text.genai_input`` for the rows matching ``GENAI_INPUT``; returns (texts, matched).

    The last message is the user message with one text part: counted from the end, the odd
    pieces between ``"`` are ``text, type, CONTENT`` (content first) or ``CONTENT, content, text``
    (strings hold no quotes).
    """
    ok = _matches(values, GENAI_INPUT, "[", "]")
    if not ok.any():
        return values, ok
    q = _Quoted(values.filter(pa.array(ok)))
    content_first = q.equals(q.piece_from_end(3), b"type")
    first, last = q.piece_from_end(5), q.piece_from_end(1)
    return q.strings((np.where(content_first, first[0], last[0]), np.where(content_first, first[1], last[1]))), ok


def genai_output(values: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """``normalize_text.genai_output`` for the rows matching ``GENAI_OUTPUT``; returns (texts, matched).

    Pieces between ``"`` from the start: 7 is ``type`` or ``content``; then 9 is ``text`` (13 the
    content), ``tool_call`` (13 the tool name) or, content first, the content itself.
    """
    ok = _matches(values, GENAI_OUTPUT, "[", "]")
    if not ok.any():
        return values, ok
    q = _Quoted(values.filter(pa.array(ok)))
    nine, thirteen = q.piece(9), q.piece(13)
    content_first = q.equals(q.piece(7), b"content")
    texts = q.strings((np.where(content_first, nine[0], thirteen[0]), np.where(content_first, nine[1], thirteen[1])))
    call = ~content_first & q.equals(nine, b"tool_call")
    if call.any():
        rows = pa.array(np.flatnonzero(call))
        named = pc.binary_join_element_wise(texts.take(rows), pa.scalar("(null)"), "")
        texts = pc.replace_with_mask(texts, pa.array(call), named)
    return texts, ok


def readable(values: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """``normalize_text.readable`` for flat objects (``FLAT_COMPACT``/``FLAT_SPACED``, conditions above)."""
    compact = _matches(values, FLAT_COMPACT, "{", "}")
    ok = compact | _matches(values, FLAT_SPACED, "{", "}", ~compact)
    if not ok.any():
        return values, ok
    sub = values.filter(pa.array(ok))
    keep = _plain_keys(pc.split_pattern(sub, '"'))  # strings hold no quote: odd pieces are string contents
    out = _spaced(sub, compact[ok])
    ok[ok] = keep
    return (out if keep.all() else out.filter(pa.array(keep))), ok


def _spaced(objects: pa.Array, compact: np.ndarray) -> pa.Array:
    """The flat objects with ``", "`` and ``": "`` separators: the ``compact`` ones are re-spaced
    (their strings hold no ``,`` or ``:``, so every one is a separator), the others kept."""
    if not compact.any():
        return objects
    spaced = _space_separators(objects if compact.all() else objects.take(pa.array(np.flatnonzero(compact))))
    if compact.all():
        return spaced
    return pc.replace_with_mask(objects, pa.array(compact), spaced)


def _space_separators(texts: pa.Array) -> pa.Array:
    """``texts`` (no nulls) with a space inserted after every ``,`` and ``:``, in one numpy pass."""
    offsets = string_offsets(texts).astype(np.int64)
    data = np.frombuffer(texts.buffers()[2], dtype=np.uint8)[offsets[0] : offsets[-1]]
    offsets -= offsets[0]
    at = np.flatnonzero((data == 0x2C) | (data == 0x3A)) + 1
    spaced = np.insert(data, at, 0x20)
    moved = offsets + np.searchsorted(at, offsets, side="right")  # spaces inserted before each offset
    return pa.StringArray.from_buffers(len(texts), pa.py_buffer(moved.astype(np.int32)), pa.py_buffer(spaced))


def _plain_keys(pieces: pa.ListArray) -> np.ndarray:
    """Per flat object (split at ``"``): whether ``readable`` keeps it as a whole, i.e. its keys are
    distinct (Python keeps a repeated key's last value), none is in ``SPECIAL_KEYS`` and it is not
    one key holding a list (``readable`` unwraps such an object to its list).

    A key is a piece followed by one starting with ``:`` (strings hold no ``:``).
    """
    n = len(pieces)
    offsets = np.asarray(pieces.offsets, dtype=np.int64)
    offsets -= offsets[0]
    flat = pc.list_flatten(pieces)
    is_key = np.zeros(len(flat), dtype=bool)
    is_key[:-1] = np.asarray(pc.starts_with(flat.slice(1), ":"), dtype=bool)
    is_key[offsets[1:][offsets[1:] > 0] - 1] = False  # the last piece of a row is never a key
    at = np.flatnonzero(is_key)
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(offsets))[at]
    encoded = pc.dictionary_encode(flat.take(pa.array(at)))
    codes = np.asarray(encoded.indices, dtype=np.int64)
    width = int(codes.max(initial=0)) + 1
    keys = np.bincount(rows, minlength=n)
    distinct = np.bincount(np.unique(rows * width + codes) // width, minlength=n)
    special = np.asarray(pc.is_in(encoded.dictionary, value_set=SPECIAL_KEYS), dtype=bool)[codes]
    after = flat.take(pa.array(at + 1))  # the separator and value after each key
    is_list = np.asarray(pc.or_(pc.starts_with(after, ":["), pc.starts_with(after, ": [")), dtype=bool)
    single_list = (keys == 1) & (np.bincount(rows[is_list], minlength=n) == 1)
    out: np.ndarray = (keys == distinct) & (np.bincount(rows[special], minlength=n) == 0) & ~single_list
    return out


FAST_PATHS: dict[str, FastPath] = {"genai_input": genai_input, "genai_output": genai_output, "readable": readable}
