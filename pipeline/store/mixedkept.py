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
waiting trace, a compaction, a confirm, a label import: another key. Never a stale answer.

Each conversation's rows are kept too (``parts``), under what they share with the others' (``Sources.base``), its
traces and the files holding one of them: a poll whose key is new computes only the conversations whose key is new
(``mixed.read_parts``). A live round's score adds a few; its build (traces not scored: no failing score, no row of
a failure query) and a stored round none, so such a poll computes nothing.

Which traces a file holds is read once per file (its ``trace_id`` column, as 64-bit hashes: a collision only adds
a file, whose rows of other traces are filtered out anyway), so a poll lists the tables and reads only new files.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from tracedag.pipeline.store import fileids, materialized
from tracedag.pipeline.store.fileids import Stamp, file_hashes, hashes_of, holds, stamps
from tracedag.pipeline.store.files import VANISHED_ATTEMPTS, parquet_files, vanished_pause
from tracedag.pipeline.store.hashes import key_hashes, within
from tracedag.pipeline.store.remote import remote_of
from tracedag.pipeline.store.views import _LATEST
from tracedag.schemas.layout import tables_dir


@dataclass(frozen=True)
class Sources:
    """What rows computed by ``store.mixed`` depend on (``key``), and the files of each refined view's raw table
    holding one of the traces computed (``files``: the only ones the computation may read)."""

    key: tuple[object, ...]
    files: dict[str, tuple[str, ...]]
    stamps: dict[str, tuple[Stamp, ...]] = field(default_factory=dict)  # ``files`` with their sizes and times
    base: tuple[object, ...] = ()  # ``key`` without the traces and their files: what every conversation's rows share


def sources(data: Path, name: str, values: dict[str, object], stale: tuple[str, ...],
            threshold: float | None, mark: bool = True) -> Sources | None:
    """The ``Sources`` of ``name``'s rows (``values``) computed over ``stale`` (sorted trace ids) and, with a
    ``threshold``, only their conversations with a failing score (``mixed.FAILURE_ROWS``); None on an object store
    (its files are listed through its manifests, and read in place) and for a process's first read (``KEEP_FIRST``;
    ``mark`` False: a look, which is no read)."""
    if remote_of(data) is not None or not _seen(data, mark):
        return None
    wanted = hashes_of(stale)
    held = {table: tuple(s for s in stamps(parquet_files(data, table)) if holds(s, wanted)) for table in _LATEST}
    others = tuple((t, stamps(parquet_files(data, t))) for t in _other_tables(data))
    asked = tuple(sorted((k, repr(v)) for k, v in values.items()))
    digest = hashlib.sha256("\n".join(stale).encode()).hexdigest()
    base = (str(data.resolve()), name, asked, materialized.signature(data), threshold, others)
    files = {table: tuple(s[0] for s in stamps) for table, stamps in held.items()}
    return Sources((*base, digest, tuple(held.items())), files, held, base)


KEEP_FIRST = False
"""Whether a process's first read of a store keeps its rows. It does not: a one-shot ``tracedag query`` would read
the trace ids of every file (~0.13 s CPU on 100k spans, the scan it replaces ~0.07 s) for no later poll; a
process's second read of the store (a poller, a server) starts keeping."""
_LOCK = threading.Lock()
"""Guards the dictionaries of this module (a server's threads run queries at once)."""
_SEEN: set[str] = set()


def _seen(data: Path, mark: bool) -> bool:
    """Whether this process read ``data``'s waiting traces before (then this read keeps what it computes); ``mark``:
    this is a read (else a look whether one is kept)."""
    where = str(data.resolve())
    with _LOCK:
        if where in _SEEN or KEEP_FIRST:
            return True
        if mark:
            _SEEN.add(where)
        return False


def _other_tables(data: Path) -> list[str]:
    """The table folders other than the refined views' and the stored rows' (``materialized_*``)."""
    root = tables_dir(data)
    names = {d.name for d in root.iterdir() if d.is_dir()} if root.is_dir() else set()
    return sorted(n for n in names if n not in _LATEST and not n.startswith(materialized.PREFIX))


_NARROWED: set[str] = set()


def indexed(data: Path) -> bool:
    """Whether this process finds ``data``'s files holding given traces by the trace ids it keeps of each file
    (``files_holding``) rather than by a scan: a local store it searched before. A one-shot command searches once, and
    scans (reading every file's ids into the index costs more than the scan, as ``KEEP_FIRST`` says); a collector's
    store passes, a server's views and a scoring run's later parts then read only the files that are new."""
    if remote_of(data) is not None:
        return False
    where = str(data.resolve())
    with _LOCK:
        if where in _NARROWED:
            return True
        _NARROWED.add(where)
        return False


def files_holding(data: Path, table: str, traces: Iterable[str]) -> tuple[str, ...]:
    """The files of ``table`` holding one of ``traces`` (or a trace whose hash is one of theirs: a file more, whose
    rows of other traces the reader filters out), from the trace ids kept of each file, a new file's read once.

    A scan of the ``trace_id`` column of every file found them before, in every pass of a live store: on 870k traces
    1.57 s of CPU a pass for five tables, 0.03 s from the kept ids (``bench/narrowed.py``)."""
    wanted = hashes_of(traces)
    for attempt in range(1, VANISHED_ATTEMPTS + 1):
        try:
            return tuple(s[0] for s in stamps(parquet_files(data, table)) if holds(s, wanted))
        except FileNotFoundError:  # a swap replaced files after the listing: list again (its new files hold the rows)
            if attempt == VANISHED_ATTEMPTS:  # (Arrow's says the path alone: ``files.file_vanished`` misses it)
                raise
            vanished_pause(attempt)
    raise AssertionError("unreachable")


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
    with _LOCK:
        _KEPT.pop(found.key, None)
        while len(_KEPT) >= KEPT_MOST:
            del _KEPT[next(iter(_KEPT))]
        _KEPT[found.key] = rows


def parts(found: Sources, groups: dict[str, tuple[str, ...]]) -> dict[str, tuple[object, ...]]:
    """The key of each conversation's rows (``groups``: conversation key -> its traces computed, sorted): what every
    one shares (``Sources.base``), its traces, and the files holding one of them in each table. A conversation's
    rows depend on its traces' rows alone (a materialize round computes them in parts of whole conversations), so a
    later turn, a late span or a new score of one conversation changes its key and no other's."""
    names = sorted(groups)
    if not names:
        return {}
    traces = [t for c in names for t in groups[c]]
    hashes = key_hashes(pa.array(traces, pa.string()))  # in the traces' order
    starts = np.cumsum([0] + [len(groups[c]) for c in names[:-1]])
    stamps = [s for table in _LATEST for s in found.stamps.get(table, ())]
    holds = np.zeros((len(stamps), len(names)), dtype=bool)
    if stamps:  # files x traces, then files x conversations (any of its traces)
        holds = np.logical_or.reduceat(np.stack([within(hashes, file_hashes(s)) for s in stamps]), starts, axis=1)
    return {c: (found.base, groups[c], tuple(stamps[i] for i in np.flatnonzero(holds[:, j])))
            for j, c in enumerate(names)}


_PARTS: dict[tuple[object, ...], pa.Table] = {}
PARTS_MOST = 100_000
"""Conversations' rows kept at most (the oldest dropped first)."""
_SCHEMAS: dict[tuple[object, ...], pa.Schema] = {}


def kept_part(key: tuple[object, ...]) -> pa.Table | None:
    """The rows computed before for the conversation ``key`` (``parts``; None: not kept)."""
    return _PARTS.get(key)


def keep_part(key: tuple[object, ...], rows: pa.Table) -> None:
    """Keep ``rows``, a conversation's computed over the files its ``key`` names."""
    with _LOCK:
        _PARTS.pop(key, None)
        while len(_PARTS) >= PARTS_MOST:
            del _PARTS[next(iter(_PARTS))]
        _PARTS[key] = rows


def schema(found: Sources) -> pa.Schema | None:
    """The columns the query computed with ``found.base`` gives (None: none computed yet)."""
    return _SCHEMAS.get(found.base)


def keep_schema(found: Sources, columns: pa.Schema) -> None:
    with _LOCK:
        if len(_SCHEMAS) > 256:
            _SCHEMAS.clear()
        _SCHEMAS[found.base] = columns


def forget(files: bool = True, conversations: bool = True) -> None:
    """Forget every kept answer, each conversation's rows (``conversations``) and which traces each file holds and
    the stores read (``files``): tests, ``bench/poll.py``."""
    with _LOCK:
        _KEPT.clear()
        if conversations:
            _PARTS.clear()
            _SCHEMAS.clear()
        if files:
            fileids.forget()
            _SEEN.clear()
            _NARROWED.clear()
