"""Columnar access to the ``map<string,string>`` attribute columns of the spans table.

The attribute maps are read once as flat (row, key, value) entries; the keys normalization needs
are picked with one hash lookup per entry (``index_in``) and scattered back into one string
column per key. No per-span Python loop touches the maps.
"""

from __future__ import annotations

import logging
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
    keys = arr.keys.slice(start, stop - start)
    values = arr.items.slice(start, stop - start)
    return Entries(rows, keys, values, n)


def scatter(values: pa.Array, rows: np.ndarray, n: int) -> pa.Array:
    """Return a length-``n`` array with ``values[i]`` at ``rows[i]`` (later entries win) and nulls elsewhere."""
    take = np.full(n, -1, dtype=np.int64)
    take[rows] = np.arange(len(rows), dtype=np.int64)
    return values.take(pa.array(take, mask=take < 0))


def pick(entries: Entries, wanted: list[str]) -> dict[str, pa.Array]:
    """Return one string column per key of ``wanted`` (null where the row lacks the key).

    One hash lookup per entry, then one ``take`` for all the keys present in the batch: a
    (present keys x rows) index matrix whose rows are sliced back out as the columns.
    """
    idx = pc.index_in(entries.keys, value_set=pa.array(wanted, pa.string()))
    k_all = np.asarray(pc.fill_null(idx, -1), dtype=np.int64)
    pos = np.flatnonzero(k_all >= 0)
    k = k_all[pos]
    present = np.flatnonzero(np.bincount(k, minlength=len(wanted)))
    slot = np.full(len(wanted), -1, dtype=np.int64)
    slot[present] = np.arange(len(present))
    take = np.full((len(present), entries.n), -1, dtype=np.int64)
    take[slot[k], entries.rows[pos]] = pos  # a repeated key: the later entry wins
    flat = take.ravel()
    values = entries.values.take(pa.array(flat, mask=flat < 0))
    nulls = pa.nulls(entries.n, pa.string())
    return {key: nulls if slot[j] < 0 else values.slice(int(slot[j]) * entries.n, entries.n)
            for j, key in enumerate(wanted)}


def family(entries: Entries, prefix: str, pattern: str) -> pa.Table:
    """Entries whose key starts with ``prefix`` and matches ``pattern`` (named groups ``idx``, ``field``).

    Returns a table ``row``, ``idx`` (int64), ``field``, ``value``: the indexed attribute families
    such as ``llm.input_messages.{i}.message.content`` or ``gen_ai.prompt.{i}.role``.
    """
    mask = pc.fill_null(pc.starts_with(entries.keys, prefix), False)
    keys = entries.keys.filter(mask)
    parts = pc.extract_regex(keys, pattern)
    ok = pc.is_valid(parts)
    parts = parts.filter(ok)
    return pa.table(
        {
            "row": pa.array(entries.rows[np.asarray(mask, dtype=bool)]).filter(ok),
            "idx": pc.cast(parts.field("idx"), pa.int64()),
            "field": parts.field("field"),
            "value": entries.values.filter(mask).filter(ok),
        }
    )


def coalesce(*arrays: pa.Array) -> pa.Array:
    """First non-null value per row, empty strings counting as null."""
    cleaned = [pc.if_else(pc.equal(a, ""), pa.scalar(None, a.type), a) if pa.types.is_string(a.type) else a for a in arrays]
    return cleaned[0] if len(cleaned) == 1 else pc.coalesce(*cleaned)


def on_dictionary(arr: pa.ChunkedArray | pa.Array, fn: Callable[[pa.Array], pa.Array]) -> pa.Array:
    """Apply a vectorised string function to a (possibly dictionary-encoded) column, once per distinct value."""
    a = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
    if pa.types.is_dictionary(a.type):
        return fn(a.dictionary).take(a.indices)
    return fn(a)


def regex_field(arr: pa.Array, pattern: str) -> pa.Array:
    """The named group ``v`` of ``pattern`` in each string (null where it does not match)."""
    parts = pc.extract_regex(arr, pattern)
    return pc.if_else(pc.is_valid(parts), parts.field("v"), pa.scalar(None, pa.string()))


def to_int(arr: pa.Array) -> pa.Array:
    """Parse decimal integer text (``12``, ``12.0``) into int64; anything else becomes null."""
    ok = pc.fill_null(pc.match_substring_regex(arr, r"^\s*-?\d+(\.0*)?\s*$"), False)
    text = pc.if_else(ok, arr, pa.scalar(None, pa.string()))
    return pc.cast(pc.cast(text, pa.float64()), pa.int64())
