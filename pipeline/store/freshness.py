"""Whether the stored (materialized) rows answer a named query now, and the statement that reads them when they do.

``freshness`` names, for a store, the built traces whose stored rows are not current (their conversation has a
latest build without a stored round, or the stored round saw other SQL or human labels): ``store.mixed``
computes those from the SQL. The answer is remembered by the listing of the builds' and the rounds' files, per
process, on disk and, on an object store, beside its tables (``freshkept``). ``named_statement`` reads a query's
rows (``materialized.reader_sql``, or one trace's newest round, ``materialized.pinned_sql``) when its parameters
are the materialized ones and the stored rows answer the traces it asks for; else None (run the SQL).
"""

from __future__ import annotations

import bisect
import logging
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tracedag.pipeline.store import current_rounds, freshdelta, freshkept
from tracedag.pipeline.store.cachereads import local_copies, native_reads
from tracedag.pipeline.store.files import parquet_files
from tracedag.pipeline.store.listing import source_uris
from tracedag.pipeline.store.materialized import (
    STATE,
    matches,
    pinned_sql,
    reader_sql,
    reader_values,
    scope_flags,
    signature,
    views,
)
from tracedag.pipeline.store.remote import remote_of
from tracedag.schemas.layout import tables_dir

if TYPE_CHECKING:  # store.gc imports this module in the converters, which must not load DuckDB
    import duckdb

logger = logging.getLogger(__name__)


# One statement (the latest builds computed once): the number of built traces; how many traces' latest build is not
# their newest stored row's (``current_rounds``: a build not stored yet; a trace no longer built); the signature
# of the newest round; and the traces the stored rows do not answer: every trace of a conversation one of whose
# traces has such a build (a new turn changes the earlier turns' rows: a materialize round widens its scope the
# same way) and the stored traces no longer built.
_FRESHNESS_SQL = f"""
with latest as materialized (
    select trace_id, arg_max(build_id, (built_unix_nano, build_id)) as build_id,
           arg_max(coalesce(conversation_id, trace_id), (built_unix_nano, build_id)) as conversation_key
    from traces_all group by trace_id
),
pairs as materialized (
    select l.trace_id as built, c.trace_id as stored, l.conversation_key
    from latest l full join {current_rounds.RELATION} c on c.trace_id = l.trace_id
    where l.build_id is distinct from c.build_id
)
select (select count(*) from latest),
       (select count(*) from pairs),
       (select arg_max(signature, mat_round) from {current_rounds.RELATION}),
       (select coalesce(list(trace_id order by trace_id), []) from (
            select trace_id from latest
            where conversation_key in (select conversation_key from pairs where built is not null)
            union all select stored from pairs where built is null))
"""


@dataclass(frozen=True)
class Freshness:
    """How far a store's stored rows answer: ``usable`` (the views exist, the newest round saw today's SQL
    and human labels, and they answer at least half the traces: else the SQL is as cheap) and ``stale``,
    the traces they do not answer (sorted ids; ``store.mixed`` computes those from the SQL)."""

    usable: bool
    stale: tuple[str, ...] = ()
    traces: int = 0

    @property
    def fresh(self) -> bool:
        """Every built trace is answered by the stored rows."""
        return self.usable and not self.stale


FRESH_VERSION = "stale=latest-build-not-newest-stored"
"""What a kept answer's ``stale`` means (part of its key): answers of an older meaning are asked again."""
_FRESH: dict[tuple[str, ...], Freshness] = {}
"""Answers of ``freshness`` by the files it depends on (files never change: a new state has new names)."""


def _listed(data: Path) -> list[Path]:
    """The files an answer of ``freshness`` depends on: the builds' and the state's."""
    return [f for t in ("traces", STATE) for f in parquet_files(data, t)]


def _fresh_key(data: Path, files: list[Path] | None = None) -> tuple[str, ...]:
    return freshkept.key(data, signature(data), FRESH_VERSION, _listed(data) if files is None else files)


def freshness(con: duckdb.DuckDBPyConnection, data: Path, has_view: bool | None = None) -> Freshness:
    """Which built traces of ``con``'s store the materialized rows answer (``Freshness``).

    Remembered by the listing of the ``traces`` and ``materialized_traces`` files (their names: a published
    file never changes, a rewrite has a new name) and the signature, per process, on disk and on an object
    store beside its tables (``freshkept``): a reader asks the tables again only when a build, a round, a
    collection or a label import wrote files.
    ``has_view``: True when the caller knows ``con`` has the state's view (None: ask its catalog, ``has_state_view``).
    """
    if not (has_view or has_state_view(con)):  # made before the store's first round landed: it has no view of the stored rows
        return Freshness(False)
    files = _listed(data)
    key = _fresh_key(data, files)
    if key not in _FRESH:
        if len(_FRESH) > 256:
            _FRESH.clear()
        found = kept_freshness(data, key)
        if found is None:
            found, pinned = _freshness_now(con, data, files)
            if pinned and _fresh_key(data) == key:  # no file came or went meanwhile: the answer is that listing's
                keep_freshness(data, key, found)
        _FRESH[key] = found
    return _FRESH[key]


def known_freshness(data: Path) -> Freshness | None:
    """``freshness``'s answer for the store's listing now when this process or an earlier one kept it, without a
    connection (None: not known; ``freshness`` then asks the tables)."""
    key = _fresh_key(data)
    found = _FRESH.get(key)
    if found is None:
        found = kept_freshness(data, key)
        if found is not None:
            _FRESH[key] = found
    return found


_HAS_VIEW: weakref.WeakKeyDictionary[duckdb.DuckDBPyConnection, bool] = weakref.WeakKeyDictionary()
"""Connections known to have the state's view (a view is made again, never dropped: it stays)."""


def know_state_view(con: duckdb.DuckDBPyConnection) -> None:
    """Say that ``con`` has the state's view (``views.create_views`` just made it): ``has_state_view`` then scans no
    catalog."""
    _HAS_VIEW[con] = True


def has_state_view(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether ``con`` has the state's view, i.e. a round was stored when it connected. A round writes its state
    last, so a connection that has it has the view of every stored table too (each has a ``schema.parquet``
    before its first state row). A connection found with it, or whose views were made with it (``know_state_view``),
    is remembered (a catalog scan costs 0.7-8 ms); one without it is asked again (its views may be made again over a
    store that has a round now)."""
    if _HAS_VIEW.get(con):
        return True
    from tracedag.pipeline.store import procdb  # DuckDB: not at the top (the converters import us)

    found = con.execute(f"select count(*) from duckdb_views() where view_name = ? and {procdb.SEEN}", [STATE]).fetchall()
    if found[0][0]:
        _HAS_VIEW[con] = True
    return bool(found[0][0])


KEPT = freshkept.KEPT
"""``<data>/state/materialized/fresh-<digest of the listing>.json``: the last ``freshness`` answer, for the next
process (``tracedag query``/``show``/a poll would each scan ``traces`` and the state again: ~0.1 s CPU on 1M spans);
on an object store also ``<store>/state/materialized-fresh.json`` (``freshkept``)."""


def kept_freshness(data: Path, key: tuple[str, ...]) -> Freshness | None:
    """The answer an earlier process kept (here, or published to the store) for the listing ``key`` (None: none)."""
    doc = freshkept.read(data, key)
    if doc is None:
        return None
    return Freshness(bool(doc["usable"]), tuple(str(t) for t in doc["stale"]), int(doc["traces"]))


def keep_freshness(data: Path, key: tuple[str, ...], state: Freshness) -> None:
    """Keep ``state`` as the answer for ``key`` (the answers for older listings are removed), and publish it to the
    object store ``data`` works on."""
    freshkept.keep(data, key, {"usable": state.usable, "stale": list(state.stale), "traces": state.traces})


def fresh(con: duckdb.DuckDBPyConnection, data: Path) -> bool:
    """Whether ``con``'s store has every named query's materialized rows, current for every trace."""
    return freshness(con, data).fresh


def _freshness_now(con: duckdb.DuckDBPyConnection, data: Path, files: list[Path]) -> tuple[Freshness, bool]:
    """``freshness`` asked of the tables; and whether the answer is that of exactly ``files`` (the listing its key
    names: then it may be kept). An object store's views list their files when they are made, maybe before
    ``files`` were listed: its builds are read from ``files`` here; the current rounds are those of ``files``
    unless a round landed meanwhile. A process that asked before, of a listing ``files`` only adds to, asks only about
    the traces of the new files and those stale then (``freshdelta``)."""
    import duckdb

    if not all(parquet_files(data, t) for t in views()):  # the store's, not the connection's views: a reader of
        return Freshness(False), True                     # one trace makes only those it reads (show.SHOWN_TABLES)
    traces_files, state_files = _of(data, files, "traces"), _of(data, files, STATE)
    try:
        current = current_rounds.register(con, data)
        if current is None:
            return Freshness(False), True
        same_rounds = _state_files(current.listing) == {str(f) for f in state_files}
        raw = freshdelta.step(con, data, traces_files, state_files, current) if same_rounds else None
        if raw is not None:
            return _judged(data, raw), True
        builds, pinned = _builds_source(con, data, traces_files)
        pinned = pinned and same_rounds
        traces, _, sig, stale = con.execute(_FRESHNESS_SQL.replace("from traces_all", f"from {builds}")).fetchall()[0]
    except duckdb.BinderException:  # state files of an older layout only: a full round will follow
        return Freshness(False), True
    raw = freshdelta.Raw(int(traces), None if sig is None else str(sig), tuple(str(t) for t in stale))
    if pinned and _listed(data) == files:  # no round landed under the SQL (a local view reads the folder as it is)
        freshdelta.remember(data, traces_files, state_files, raw)
    return _judged(data, raw), pinned


def _judged(data: Path, raw: freshdelta.Raw) -> Freshness:
    """What ``raw`` says of the store now: unusable when the newest round saw other SQL or human labels, or when the
    stored rows answer less than half the traces (the SQL over every trace costs about as much)."""
    if str(raw.signature or "") != signature(data):
        return Freshness(False)
    if not raw.stale:  # no trace's latest build lacks its stored round (each such trace is stale itself)
        return Freshness(True)
    if 2 * len(raw.stale) > raw.traces:
        return Freshness(False)
    return Freshness(True, raw.stale, raw.traces)


def _builds_source(con: duckdb.DuckDBPyConnection, data: Path, traces: list[Path]) -> tuple[str, bool]:
    """What ``_FRESHNESS_SQL`` reads the builds from: ``traces_all`` on a local store (its view reads the folder as
    it is), the files ``traces`` on an object store (a view reads the files listed when it was made); and whether
    they are ``traces``."""
    if remote_of(data) is None:
        return "traces_all", True
    if not traces:
        return "traces_all", False
    with native_reads(con):
        uris = local_copies(data, source_uris(data, traces))
    names = ", ".join("'" + u.replace("'", "''") + "'" for u in uris)
    return f"read_parquet([{names}], union_by_name = false, hive_partitioning = false)", True


def _of(data: Path, files: list[Path], table: str) -> list[Path]:
    """The files of ``table`` among ``files`` (``parquet_files`` of several tables)."""
    return [f for f in files if f.relative_to(tables_dir(data)).parts[0] == table]


def _state_files(listing: tuple[str, ...]) -> set[str]:
    """The paths of ``current_rounds.listing``'s stamps (a path, then its size and mtime when it is local)."""
    return {n.split("\x1f", 1)[0] for n in listing}


def answered(state: Freshness, trace_id: str) -> bool:
    """Whether the stored rows answer ``trace_id`` (its conversation has no trace left to materialize)."""
    i = bisect.bisect_left(state.stale, trace_id)
    return state.usable and not (i < len(state.stale) and state.stale[i] == trace_id)


def named_statement(con: duckdb.DuckDBPyConnection, data: Path, name: str, values: dict[str, object],
                    current: str = "") -> tuple[str, dict[str, object]] | None:
    """The statement and values that answer ``name`` from materialized rows, or None (run its SQL, or
    ``store.mixed`` when the stored rows answer most traces but not all); ``current`` as ``reader_sql``'s.

    On a store whose newest builds are not all materialized yet, one trace the stored rows answer is
    still read from them."""
    return named_statements(con, data, [(name, values)], current)[0]


def named_statements(con: duckdb.DuckDBPyConnection, data: Path, wanted: list[tuple[str, dict[str, object]]],
                     current: str = "", has_view: bool | None = None) -> list[tuple[str, dict[str, object]] | None]:
    """``named_statement`` of each ``(name, values)`` of ``wanted``, the store's freshness asked once and each
    trace's newest round looked up once (a trace's first view reads three queries: ~15 ms CPU each time);
    ``has_view`` as ``freshness``'s."""
    state: Freshness | None = None
    newest: dict[str, int | None] = {}
    out: list[tuple[str, dict[str, object]] | None] = []
    for name, values in wanted:
        if not matches(name, values):
            out.append(None)
            continue
        if state is None:
            state = freshness(con, data, has_view)
        out.append(_statement(data, name, values, state, newest, current))
    return out


def _statement(data: Path, name: str, values: dict[str, object], state: Freshness, newest: dict[str, int | None],
               current: str) -> tuple[str, dict[str, object]] | None:
    """``named_statement``'s answer once ``name``'s parameters match, given the store's ``state``; ``newest``: the
    newest rounds looked up so far, by trace id."""
    one, whole = scope_flags(values)
    if not state.fresh and not (one and answered(state, str(values["trace_id"]))):
        return None
    logger.info("query %s: reading its materialized rows", name)
    if one and values.get("since_ns") in (0, None):  # one trace, no time window: its newest round is all it needs
        trace_id = str(values["trace_id"])
        if trace_id not in newest:
            newest[trace_id] = current_rounds.lookup(data, trace_id)
        if newest[trace_id] is not None:
            pinned: dict[str, object] = {k: v for k, v in reader_values(name, values).items() if k != "since_ns"}
            return pinned_sql(name), {**pinned, "mat_round": newest[trace_id]}
    return reader_sql(name, one, whole, current=current), reader_values(name, values)
