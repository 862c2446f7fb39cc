"""The rows ``store.mixed`` computed for the traces not stored yet, kept per state of the files they come from.

A live poll (``tracedag query root_causes``, ``bench/live.py``'s polls every 0.5 s) while traces wait to be stored
computes their rows from the SQL: ~0.3 s CPU to plan and run the failure graph however few the traces, plus
~0.2 s to restrict the views (issue #31: a poll <= 0.2 s). Rounds come ~1 s apart: most polls between two rounds
ask the same question of the same files. ``Sources`` names what the computed rows depend on: the query and its
parameters, the SQL and the human labels (``materialized.signature``), the traces computed (the stale ones), the
files holding one of them in each table the refined views read (``views._LATEST``; what ``mixed.narrowed`` reads:
a span file of traces not built yet does not count), and every file of every other table but the stored rows' (a
query may read them whole: ``root_cause_checks``...). A file is named by its path, size and modification time
(a published file never changes; a rewrite in place changes its size or time). The rows computed over those
files are kept under that key, in this process: a later poll with the same key reads the stored rows and these.
A new round (a build, a score, a stored round: other stale traces, or files that hold them), a late span of a
waiting trace, a compaction, a confirm, a label import: another key, computed again. Never a stale answer.

Which traces a file holds is read once per file (its ``trace_id`` column, as 64-bit hashes: a collision only adds
a file, whose rows of other traces are filtered out anyway), so a poll lists the tables and reads only new files.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tracedag.pipeline.store import materialized
from tracedag.pipeline.store.files import parquet_files
from tracedag.pipeline.store.remote import remote_of
from tracedag.pipeline.store.views import _LATEST
from tracedag.schemas.layout import tables_dir

Stamp = tuple[str, int, int]
"""A file as a key names it: path, size, modification time (ns)."""


@dataclass(frozen=True)
class Sources:
    """What rows computed by ``store.mixed`` depend on (``key``), and the files of each refined view's raw table
    holding one of the traces computed (``files``: the only ones the computation may read)."""

    key: tuple[object, ...]
    files: dict[str, tuple[str, ...]]


def sources(data: Path, name: str, values: dict[str, object], stale: tuple[str, ...],
            threshold: float | None) -> Sources | None:
    """The ``Sources`` of ``name``'s rows (``values``) computed over ``stale`` (sorted trace ids) and, with a
    ``threshold``, only their conversations with a failing score (``mixed.FAILURE_ROWS``); None on an object store
    (its files are listed through its manifests, and read in place)."""
    if remote_of(data) is not None:
        return None
    wanted = _hashes(stale)
    files: dict[str, tuple[str, ...]] = {}
    held: list[tuple[str, tuple[Stamp, ...]]] = []
    for table in _LATEST:
        stamps = tuple(s for s in _stamps(parquet_files(data, table)) if _holds(s, wanted))
        files[table] = tuple(s[0] for s in stamps)
        held.append((table, stamps))
    others = tuple((t, _stamps(parquet_files(data, t))) for t in _other_tables(data))
    asked = tuple(sorted((k, repr(v)) for k, v in values.items()))
    digest = hashlib.sha256("\n".join(stale).encode()).hexdigest()
    key = (str(data.resolve()), name, asked, materialized.signature(data), threshold, digest, tuple(held), others)
    return Sources(key, files)


def _other_tables(data: Path) -> list[str]:
    """The table folders other than the refined views' and the stored rows' (``materialized_*``)."""
    root = tables_dir(data)
    names = {d.name for d in root.iterdir() if d.is_dir()} if root.is_dir() else set()
    return sorted(n for n in names if n not in _LATEST and not n.startswith(materialized.PREFIX))


def _stamps(files: Iterable[Path]) -> tuple[Stamp, ...]:
    out = []
    for f in files:
        st = os.stat(f)  # gone meanwhile (a swap): FileNotFoundError, which the caller's rerun_if_vanished plans again
        out.append((str(f), st.st_size, st.st_mtime_ns))
    return tuple(out)


_IDS: dict[Stamp, np.ndarray] = {}
"""The sorted hashes of the trace ids each file holds, by its stamp."""
_IDS_MOST = 4_000_000
"""Hashes kept at most (8 bytes each); then forgotten and read again as asked."""


def _hashes(ids: Iterable[str]) -> np.ndarray:
    return np.unique(np.fromiter((hash(t) for t in ids), dtype=np.int64))


def _file_hashes(stamp: Stamp) -> np.ndarray:
    found = _IDS.get(stamp)
    if found is None:
        column = pq.read_table(stamp[0], columns=["trace_id"]).column("trace_id")
        found = _hashes(pc.unique(column).to_pylist())
        if sum(len(a) for a in _IDS.values()) + len(found) > _IDS_MOST:
            _IDS.clear()
        _IDS[stamp] = found
    return found


def _holds(stamp: Stamp, wanted: np.ndarray) -> bool:
    """Whether the file ``stamp`` holds a trace whose hash is in ``wanted`` (sorted)."""
    have = _file_hashes(stamp)
    if not len(have) or not len(wanted):
        return False
    at = np.searchsorted(have, wanted).clip(0, len(have) - 1)
    return bool((have[at] == wanted).any())


_KEPT: dict[tuple[object, ...], pa.Table] = {}
KEPT_MOST = 8
"""Answers kept at most (a poll asks one or a few queries; the oldest is dropped first)."""


def kept(found: Sources | None) -> pa.Table | None:
    """The rows computed before for exactly ``found`` (None: none kept, or no ``Sources``)."""
    return None if found is None else _KEPT.get(found.key)


def keep(found: Sources | None, rows: pa.Table) -> None:
    """Keep ``rows``, computed over exactly ``found``'s files, for a later ``kept``."""
    if found is None:
        return
    _KEPT.pop(found.key, None)
    while len(_KEPT) >= KEPT_MOST:
        del _KEPT[next(iter(_KEPT))]
    _KEPT[found.key] = rows


def forget(files: bool = True) -> None:
    """Forget every kept answer, and (``files``) which traces each file holds (tests, ``bench/poll.py``)."""
    _KEPT.clear()
    if files:
        _IDS.clear()
