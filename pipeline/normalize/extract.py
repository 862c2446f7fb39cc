"""Columnar access to the ``map<string,string>`` attribute columns of the spans table.

The attribute maps are read once as flat (row, key, value) entries; the keys normalization needs
are picked with one hash lookup per entry (``index_in``) and scattered back into one string
column per key. No per-span Python loop touches the maps.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Entries:
    """The entries of one map column: ``rows[i]`` owns ``keys[i]`` = ``values[i]``; ``n`` rows in all."""

    rows: np.ndarray
    keys: pa.Array
    values: pa.Array
    n: int


def single_chunk(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """The column as one array, without copying when it already is one chunk."""
    if isinstance(column, pa.ChunkedArray):
        return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    return column


def map_entries(column: pa.ChunkedArray | pa.Array) -> Entries:
    """Flatten a map column into its (row, key, value) entries."""
    arr = single_chunk(column)
    n = len(arr)
    if n == 0:
        empty = pa.array([], pa.string())
        return Entries(np.zeros(0, np.int64), empty, empty, 0)
    offsets = np.asarray(arr.offsets, dtype=np.int64)
    start, stop = int(offsets[0]), int(offsets[-1])
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(offsets))
    keys = _plain_string(arr.keys.slice(start, stop - start))
    values = _plain_string(arr.items.slice(start, stop - start))
    return Entries(rows, keys, values, n)


def _plain_string(arr: pa.Array) -> pa.Array:
    """``arr`` as ``pa.string()`` (``pick`` assembles columns from its 32-bit offsets)."""
    return arr if arr.type == pa.string() else arr.cast(pa.string())


def string_offsets(arr: pa.Array) -> np.ndarray:
    """The ``len(arr) + 1`` int32 offsets of a ``string`` array (positions in its data buffer)."""
    offsets: np.ndarray = np.frombuffer(arr.buffers()[1], dtype=np.int32)[arr.offset : arr.offset + len(arr) + 1]
    return offsets


def scatter(values: pa.Array, rows: np.ndarray, n: int) -> pa.Array:
    """Return a length-``n`` array with ``values[i]`` at ``rows[i]`` (later entries win) and nulls elsewhere."""
    take = np.full(n, -1, dtype=np.int64)
    take[rows] = np.arange(len(rows), dtype=np.int64)
    return values.take(pa.array(take, mask=take < 0))


def pick(entries: Entries, wanted: list[str]) -> dict[str, pa.Array]:
    """Return one string column per key of ``wanted`` (null where the row lacks the key).

    One hash lookup per entry; the picked entries are gathered once, grouped by key (rows in
    order, a repeated key keeping its later entry), and each key's column is assembled from
    offsets over that one buffer (no per-key copy of the strings).
    """
    k, rows, pos = _picked(entries, wanted)
    values = entries.values.take(pa.array(pos))
    bounds = np.searchsorted(k, np.arange(len(wanted) + 1))
    nulls = pa.nulls(entries.n, pa.string())
    return {key: _column(values, rows, int(bounds[j]), int(bounds[j + 1]), entries.n) if bounds[j] < bounds[j + 1]
            else nulls for j, key in enumerate(wanted)}


def _column(values: pa.Array, rows: np.ndarray, a: int, b: int, n: int) -> pa.Array:
    """The length-``n`` string column with ``values[a:b]`` at ``rows[a:b]`` (increasing), sharing ``values``' data."""
    voff = string_offsets(values)
    lengths = np.zeros(n, dtype=np.int32)
    lengths[rows[a:b]] = np.diff(voff[a : b + 1])
    offsets = np.empty(n + 1, dtype=np.int32)
    offsets[0] = 0
    np.cumsum(lengths, out=offsets[1:])
    offsets += voff[a]
    valid = np.zeros(n, dtype=bool)
    valid[rows[a:b]] = True
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), values.buffers()[2], bitmap, null_count=n - (b - a))


@dataclass(frozen=True)
class Sparse:
    """The rows (increasing) of a map column holding a non-empty value for a key, and that entry's position."""

    rows: np.ndarray
    pos: np.ndarray


def _picked(entries: Entries, wanted: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(key index, row, entry position) of the entries whose key is wanted, by key then row, last per (key, row)."""
    idx = pc.index_in(entries.keys, value_set=pa.array(wanted, pa.string()))
    k_all = np.asarray(pc.fill_null(idx, -1), dtype=np.int64)
    pos = np.flatnonzero(k_all >= 0)
    pos = pos[np.argsort(k_all[pos].astype(np.int16), kind="stable")]  # rows stay in order
    k, rows = k_all[pos], entries.rows[pos]
    last = np.ones(len(k), dtype=bool)
    last[:-1] = (k[1:] != k[:-1]) | (rows[1:] != rows[:-1])  # a repeated key: the later entry wins
    return k[last], rows[last], pos[last]


def pick_sparse(entries: Entries, wanted: list[str]) -> dict[str, Sparse]:
    """Per key of ``wanted``, the rows with a non-empty value and where it is (no string is copied)."""
    k, rows, pos = _picked(entries, wanted)
    offsets = string_offsets(entries.values)
    nonempty = offsets[pos + 1] > offsets[pos]
    k, rows, pos = k[nonempty], rows[nonempty], pos[nonempty]
    bounds = np.searchsorted(k, np.arange(len(wanted) + 1))
    return {key: Sparse(rows[bounds[j] : bounds[j + 1]], pos[bounds[j] : bounds[j + 1]]) for j, key in enumerate(wanted)}


def first_present(*cols: Sparse) -> Sparse:
    """Per row, the first of ``cols`` (in priority order) that has a value."""
    if len(cols) == 1:
        return cols[0]
    rows = np.concatenate([c.rows for c in cols])
    pos = np.concatenate([c.pos for c in cols])
    prio = np.concatenate([np.full(len(c.rows), i) for i, c in enumerate(cols)])
    order = np.lexsort((prio, rows))
    rows, pos = rows[order], pos[order]
    first = np.ones(len(rows), dtype=bool)
    first[1:] = rows[1:] != rows[:-1]
    return Sparse(rows[first], pos[first])


def with_prefixes(entries: Entries, prefixes: list[str]) -> Entries:
    """The entries whose key starts with one of ``prefixes`` (one pass; ``family`` then scans fewer keys)."""
    mask = np.zeros(len(entries.keys), dtype=bool)
    for prefix in prefixes:
        mask |= true_mask(pc.starts_with(entries.keys, prefix))
    if mask.all():
        return entries
    keep = pa.array(mask)
    return Entries(entries.rows[mask], entries.keys.filter(keep), entries.values.filter(keep), entries.n)


_EMPTY_FAMILY = pa.table({"row": pa.array([], pa.int64()), "idx": pa.array([], pa.int64()),
                          "field": pa.array([], pa.string()), "value": pa.array([], pa.string())})


def family(entries: Entries, prefix: str, pattern: str) -> pa.Table:
    """Entries whose key starts with ``prefix`` and matches ``pattern`` (named groups ``idx``, ``field``).

    Returns a table ``row``, ``idx`` (int64), ``field``, ``value``: the indexed attribute families
    such as ``llm.input_messages.{i}.message.content`` or ``gen_ai.prompt.{i}.role``.
    """
    hit = true_mask(pc.starts_with(entries.keys, prefix))
    if not hit.any():  # the usual case for all but one dialect: no regex to compile
        return _EMPTY_FAMILY
    mask = pa.array(hit)
    keys = entries.keys.filter(mask)
    parts = pc.extract_regex(keys, pattern)
    ok = pc.is_valid(parts)
    parts = parts.filter(ok)
    return pa.table(
        {
            "row": pa.array(entries.rows[hit]).filter(ok),
            "idx": pc.cast(parts.field("idx"), pa.int64()),
            "field": parts.field("field"),
            "value": entries.values.filter(mask).filter(ok),
        }
    )


def all_null(arr: pa.Array) -> bool:
    """Whether every value of ``arr`` is null (most attribute columns are, in a one-dialect batch)."""
    return bool(arr.null_count == len(arr))


def coalesce(*arrays: pa.Array) -> pa.Array:
    """First non-null value per row, empty strings counting as null (all-null inputs are skipped)."""
    cleaned = [empty_as_null(a) if pa.types.is_string(a.type) else a for a in arrays]
    live = [a for a in cleaned if not all_null(a)] or cleaned[:1]
    return live[0] if len(live) == 1 else pc.coalesce(*live)


def empty_as_null(arr: pa.Array) -> pa.Array:
    """``arr`` with its empty strings made null (a new validity bitmap over the same data buffers)."""
    if arr.null_count == len(arr):
        return arr
    offsets = string_offsets(arr)
    keep = np.diff(offsets) > 0
    valid = valid_mask(arr)
    if keep[valid].all():
        return arr
    keep &= valid
    bitmap = pa.py_buffer(np.packbits(keep, bitorder="little"))
    return pa.StringArray.from_buffers(len(arr), pa.py_buffer(np.ascontiguousarray(offsets)), arr.buffers()[2], bitmap)


def _bits(buf: pa.Buffer, offset: int, n: int) -> np.ndarray:
    """Bits ``offset`` .. ``offset + n`` of an Arrow bitmap, as numpy bools."""
    raw = np.frombuffer(buf, dtype=np.uint8)[offset // 8 : (offset + n - 1) // 8 + 1]
    bits: np.ndarray = np.unpackbits(raw, bitorder="little")[offset % 8 : offset % 8 + n].view(bool)
    return bits


def valid_mask(arr: pa.Array) -> np.ndarray:
    """Per row, whether ``arr`` holds a value there (the validity bitmap, unpacked)."""
    validity = arr.buffers()[0]
    if not arr.null_count or validity is None:
        return np.ones(len(arr), dtype=bool)
    return _bits(validity, arr.offset, len(arr))


def true_mask(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A boolean array as numpy bools, null counting as false (its bitmaps unpacked, not converted per value)."""
    arr = single_chunk(arr)
    if len(arr) == 0:
        return np.zeros(0, dtype=bool)
    values = _bits(arr.buffers()[1], arr.offset, len(arr)).copy()
    if arr.null_count:
        values &= valid_mask(arr)
    return values


def on_dictionary(arr: pa.ChunkedArray | pa.Array, fn: Callable[[pa.Array], pa.Array]) -> pa.Array:
    """Apply a vectorised string function to a column once per distinct value (dictionary-encoding it if needed)."""
    a = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
    if not pa.types.is_dictionary(a.type):
        a = pc.dictionary_encode(a)
    return fn(a.dictionary).take(a.indices)


def regex_field(arr: pa.Array, pattern: str) -> pa.Array:
    """The named group ``v`` of ``pattern`` in each string (null where it does not match)."""
    if all_null(arr):
        return pa.nulls(len(arr), pa.string())
    parts = pc.extract_regex(arr, pattern)
    return pc.if_else(pc.is_valid(parts), parts.field("v"), pa.scalar(None, pa.string()))


def key_value(arr: pa.Array, key: str, value: str) -> pa.Array:
    """``regex_field(arr, '"key":\\s*' + value)``, without an unanchored capture over each whole text.

    Each text is split at its first ``"key"``; ``value`` is matched anchored right after it. Texts
    holding ``"key"`` where that fails (the first occurrence is not the key of the match) take the
    unanchored pattern.
    """
    if all_null(arr):
        return pa.nulls(len(arr), pa.string())
    quoted = json.dumps(key)
    parts = pc.split_pattern(arr, quoted, max_splits=1)
    offsets = np.asarray(parts.offsets, dtype=np.int64)
    has = np.diff(offsets) == 2
    flat = pc.list_flatten(parts)
    tails = scatter(flat.take(pa.array(offsets[:-1][has] - offsets[0] + 1)), np.flatnonzero(has), len(arr))
    found = regex_field(tails, r"^:\s*" + value)
    retry = np.flatnonzero(has & ~np.asarray(pc.is_valid(found), dtype=bool))
    if len(retry) == 0:
        return found
    slow = regex_field(arr.take(pa.array(retry)), re.escape(quoted) + r":\s*" + value)
    mask = np.zeros(len(arr), dtype=bool)
    mask[retry] = True
    return pc.replace_with_mask(found, pa.array(mask), slow)


def to_int(arr: pa.Array) -> pa.Array:
    """Parse decimal integer text (``12``, ``12.0``) into int64; anything else becomes null."""
    if all_null(arr):
        return pa.nulls(len(arr), pa.int64())
    ok = pc.fill_null(pc.match_substring_regex(arr, r"^\s*-?\d+(\.0*)?\s*$"), False)
    text = pc.if_else(ok, arr, pa.scalar(None, pa.string()))
    return pc.cast(pc.cast(text, pa.float64()), pa.int64())
