"""A reader's freshness (``store.freshness``) from what the rounds wrote since this process last asked.

``freshness._FRESHNESS_SQL`` reads every row of ``traces_all``: on 870k traces ~1 s of CPU, paid by each poll after
a round (a poller, ``tracedag serve``'s views of a live store) however few traces the round wrote. Its answer changes
only through files: a trace's latest build through a new ``traces`` file, its newest stored round through a new state
file (published files never change). So the answer for a listing that only added files to one this process asked
the SQL about is found from the candidates alone: the traces of the new files and those stale before (a trace that
was not stale, in no new file, still has the same latest build and newest stored round). Those of them whose latest
build is not their newest stored round's build (or that are stored and no longer built) make every trace of their
conversations stale: the traces with a row of one of those conversation keys (``store.conversation_keys``), by their
latest build's key. The built traces are counted from the trace ids this process keeps of each file
(``store.fileids``). A listing from which a file went (a collection), a process's first ask and an object store's are
asked of the SQL (0.84-1.25 s on 870k traces against 0.05-0.065 s: ``bench/fresh_delta.py``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracedag.pipeline.store import conversation_keys
from tracedag.pipeline.store.current_rounds import RELATION, Current
from tracedag.pipeline.store.fileids import Stamp, file_hashes, hashes_of, holds, ids_of, rows_in, stamps
from tracedag.pipeline.store.hashes import sorted_unique, within
from tracedag.pipeline.store.latest import LATEST_CONVERSATIONS_SQL
from tracedag.pipeline.store.remote import remote_of

if TYPE_CHECKING:
    import duckdb

CANDIDATES = "__tracedag_fresh_candidates"


@dataclass(frozen=True)
class Raw:
    """What ``freshness`` judges: the built traces, the newest stored round's signature, the traces the stored rows
    do not answer (sorted)."""

    traces: int
    signature: str | None
    stale: tuple[str, ...]


@dataclass(frozen=True)
class _Base:
    """The last answer this process computed for a store, and the listing it is for."""

    traces: frozenset[Stamp]
    states: frozenset[Stamp]
    raw: Raw
    ids: np.ndarray | None = None  # the sorted hashes of every built trace id (made at the first step)


_BASES: dict[str, _Base] = {}
"""The last answer per store (its resolved path) this process computed."""
BASES_MOST = 16
"""Stores whose answers are kept at most (a process reads one or a few; a test run many): then all are forgotten."""
_LOCK = threading.Lock()


def _keep(where: str, base: _Base) -> None:
    with _LOCK:
        if where not in _BASES and len(_BASES) >= BASES_MOST:
            _BASES.clear()
        _BASES[where] = base


def remember(data: Path, traces: list[Path], states: list[Path], raw: Raw) -> None:
    """Keep ``raw``, the SQL's answer for exactly these ``traces`` and state files, for the next ``step``."""
    if remote_of(data) is not None:
        return
    try:
        base = _Base(_stamps(traces), _stamps(states), raw)
    except FileNotFoundError:  # a swap meanwhile: the next ask goes to the SQL
        return
    _keep(str(data.resolve()), base)


def step(con: duckdb.DuckDBPyConnection, data: Path, traces: list[Path], states: list[Path],
         current: Current) -> Raw | None:
    """The answer for exactly the ``traces`` and state files ``states`` (``current``: their newest rounds, registered
    on ``con`` as ``current_rounds.RELATION``) from this process's last one, or None: ask the SQL (no answer kept, a
    file gone since, an object store)."""
    import duckdb

    if remote_of(data) is not None:
        return None
    where = str(data.resolve())
    with _LOCK:
        base = _BASES.get(where)
    if base is None:
        return None
    try:
        now_t, now_s = _stamps(traces), _stamps(states)
        if not (base.traces <= now_t and base.states <= now_s):
            return None  # a collection replaced files: their rows moved, the SQL asks again
        if now_t == base.traces and now_s == base.states:
            return base.raw
        ids, added = _new_traces(all_ids(base.traces) if base.ids is None else base.ids, now_t - base.traces)
        raw = _after(con, base, added, now_t, now_s, current)
    except (FileNotFoundError, duckdb.Error):  # a file gone meanwhile, or a layout the delta cannot read
        return None
    _keep(where, _Base(now_t, now_s, raw, ids))  # a new base: another thread may be reading the one before
    return raw


def _after(con: duckdb.DuckDBPyConnection, base: _Base, added: int, now_t: frozenset[Stamp],
           now_s: frozenset[Stamp], current: Current) -> Raw:
    """``base``'s answer moved on to the listing ``now_t`` / ``now_s`` (which only added files to it, holding ``added``
    traces not built before)."""
    new_t, new_s = now_t - base.traces, now_s - base.states
    traces = base.raw.traces + added
    # the new state files' traces too: a trace whose newest stored round became another build's than its latest
    candidates = set(base.raw.stale) | ids_of(new_t) | ids_of(new_s)
    missing = _missing(con, now_t, sorted(candidates))
    built = missing.filter(missing.column("built"))
    keys = pc.unique(built.column("conversation_key")) if built.num_rows else pa.array([], pa.string())
    members = conversation_keys.members(now_t, keys)
    stale = set(_latest_within(con, now_t, sorted(members), keys))
    stale.update(str(t) for t in missing.filter(pc.invert(missing.column("built"))).column("trace_id").to_pylist())
    return Raw(traces, _newest_signature(current.table), tuple(sorted(stale)))


def _new_traces(ids: np.ndarray, new: frozenset[Stamp]) -> tuple[np.ndarray, int]:
    """``ids`` (sorted hashes of trace ids) with those of the files ``new`` (the trace ids kept: ``fileids``), and
    how many of theirs ``ids`` did not hold."""
    added = 0
    for stamp in sorted(new):
        hashes = file_hashes(stamp)
        fresh = hashes[~within(hashes, ids)]
        ids = np.insert(ids, np.searchsorted(ids, fresh), fresh)
        added += len(fresh)
    return ids, added


def all_ids(files: Iterable[Stamp]) -> np.ndarray:
    """The sorted distinct hashes of the trace ids of ``files``."""
    held = [file_hashes(s) for s in files]
    return sorted_unique(np.concatenate(held)) if held else np.zeros(0, np.uint64)


# Of the candidates, those whose latest build (over the ``{traces}`` rows holding them) is not their newest stored
# round's (``current_rounds.RELATION``), with whether they are built and their latest build's conversation key.
_MISSING_SQL = f"""
with latest as ({{latest}}),
cur as (select trace_id, build_id from {RELATION} where trace_id in (select trace_id from {CANDIDATES}))
select coalesce(l.trace_id, c.trace_id) as trace_id, l.trace_id is not null as built,
       coalesce(l.conversation_id, l.trace_id) as conversation_key
from latest l full join cur c on c.trace_id = l.trace_id
where l.build_id is distinct from c.build_id
"""

# The latest build of the ``CANDIDATES`` traces over ``{source}`` (rows holding them), with its conversation id.
_LATEST_SQL = LATEST_CONVERSATIONS_SQL.replace("from traces_all", "from {source}")


def _missing(con: duckdb.DuckDBPyConnection, files: frozenset[Stamp], candidates: list[str]) -> pa.Table:
    con.register(CANDIDATES, pa.table({"trace_id": pa.array(candidates, pa.string())}))
    return _arrow(con, _MISSING_SQL.format(latest=_LATEST_SQL.format(source=_source(files, candidates))))


def _latest_within(con: duckdb.DuckDBPyConnection, files: frozenset[Stamp], traces: list[str],
                   keys: pa.Array) -> list[str]:
    """Those of ``traces`` whose latest build's conversation key is one of ``keys``."""
    if not traces:
        return []
    con.register(CANDIDATES, pa.table({"trace_id": pa.array(traces, pa.string())}))
    latest = _arrow(con, _LATEST_SQL.format(source=_source(files, traces)))
    key = pc.coalesce(latest.column("conversation_id"), latest.column("trace_id"))
    return [str(t) for t in latest.column("trace_id").filter(pc.is_in(key, value_set=keys)).to_pylist()]


def _source(files: frozenset[Stamp], traces: list[str]) -> str:
    """SQL of the rows of ``traces`` (registered as ``CANDIDATES``) in the ``traces`` files among ``files`` that may
    hold one of them."""
    wanted = hashes_of(traces)
    holding = [s[0] for s in files if len(wanted) and holds(s, wanted)]
    return rows_in("traces", holding, f"(select trace_id from {CANDIDATES})")


def _newest_signature(current: pa.Table) -> str | None:
    """The signature of the newest stored round (``arg_max(signature, mat_round)``)."""
    if not current.num_rows:
        return None
    rounds = current.column("mat_round")
    at = pc.index(rounds, pc.max(rounds)).as_py()
    value = current.column("signature")[at].as_py()
    return None if value is None else str(value)


def _arrow(con: duckdb.DuckDBPyConnection, sql: str) -> pa.Table:
    from tracedag.pipeline.store.fetch import arrow

    return arrow(con, sql)


def _stamps(files: list[Path]) -> frozenset[Stamp]:
    return frozenset(stamps(files))
