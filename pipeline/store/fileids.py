"""Which trace ids each file holds, kept per process as 64-bit hashes: the store's files found without a scan.

A file is named by its ``Stamp`` (path, size, modification time: a published file never changes, a rewrite in place
changes its size or time). Its ``trace_id`` column is read once and kept as sorted hashes (``store.hashes``: a
collision only says a file may hold a trace, never that it does not), so a process that reads a store again (a
collector's passes, a server, a poller) reads only new files' ids: ``mixedkept.files_holding`` finds the files
holding given traces, ``freshdelta`` counts the built traces.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tracedag.pipeline.store.hashes import key_hashes, sorted_unique, within
from tracedag.pipeline.store.selection import literal

Stamp = tuple[str, int, int]
"""A file as a key names it: path, size, modification time (ns)."""


def stamps(files: Iterable[Path]) -> tuple[Stamp, ...]:
    """Each of ``files`` as a key names it (``Stamp``)."""
    out = []
    for f in files:
        st = os.stat(f)  # gone meanwhile (a swap): FileNotFoundError, which the caller's rerun_if_vanished plans again
        out.append((str(f), st.st_size, st.st_mtime_ns))
    return tuple(out)


_IDS: dict[Stamp, np.ndarray] = {}
"""The sorted hashes of the trace ids each file holds, by its stamp."""
_IDS_MOST = 8_000_000
"""Hashes kept at most (8 bytes each: 64 MB); then those of files gone are forgotten, and if still too many all are,
and read again as asked."""


def hashes_of(ids: Iterable[str] | pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The sorted distinct hashes of ``ids`` (``hashes.key_hashes``, as every index of the store hashes)."""
    array = ids if isinstance(ids, pa.Array | pa.ChunkedArray) else pa.array(list(ids), pa.string())
    return sorted_unique(key_hashes(array))


_LOCK = threading.Lock()
"""Guards ``_IDS`` (a server's threads run queries at once)."""


def file_hashes(stamp: Stamp) -> np.ndarray:
    """The sorted hashes of the trace ids the file ``stamp`` holds, read once."""
    found = _IDS.get(stamp)
    if found is None:
        found = hashes_of(pc.unique(trace_ids(stamp[0])))
        with _LOCK:
            if sum(len(a) for a in _IDS.values()) + len(found) > _IDS_MOST:
                _forget_replaced()
            if sum(len(a) for a in _IDS.values()) + len(found) > _IDS_MOST:
                _IDS.clear()
            _IDS[stamp] = found
    return found


def trace_ids(path: str) -> pa.ChunkedArray:
    """The trace ids of the file ``path``, each at least once: the dictionary of each row group's ``trace_id``, read as
    such (a file of 10M edges: 0.35 s of CPU against 1.34 s for every row's id and their distinct values)."""
    column = pq.read_table(path, columns=["trace_id"], read_dictionary=["trace_id"]).column("trace_id")
    return pa.chunked_array([chunk.dictionary for chunk in column.chunks], pa.string())


def _forget_replaced() -> None:
    """Forget the files that are gone or changed (a collection merges a live store's small files every 10 s: their
    hashes would fill ``_IDS`` and then everything would be read again)."""
    for stamp in list(_IDS):
        try:
            st = os.stat(stamp[0])
        except OSError:
            del _IDS[stamp]
            continue
        if (st.st_size, st.st_mtime_ns) != stamp[1:]:
            del _IDS[stamp]


def holds(stamp: Stamp, wanted: np.ndarray) -> bool:
    """Whether the file ``stamp`` holds a trace whose hash is in ``wanted``."""
    return bool(within(wanted, file_hashes(stamp)).any())


def ids_of(files: Iterable[Stamp]) -> set[str]:
    """The trace ids of the files ``files`` (new files of a round: a live pass's or a reader's candidates)."""
    out: set[str] = set()
    for stamp in files:
        out.update(str(t) for t in pc.unique(trace_ids(stamp[0])).to_pylist())
    return out


def rows_in(table: str, files: Iterable[str], ids: str) -> str:
    """SQL of ``table``'s rows of the traces ``ids`` (SQL of a list of them) in ``files`` (none: no rows)."""
    names = ", ".join(literal(f) for f in sorted(files))
    if not names:
        return f"(select * from {table}_all where false)"
    return (f"(select * from read_parquet([{names}], union_by_name = false, hive_partitioning = false) "
            f"where trace_id in {ids})")


def forget() -> None:
    """Forget every file's ids (tests, ``bench/poll.py``)."""
    with _LOCK:
        _IDS.clear()
