"""Reading the named queries' results materialized at score time (``tracedag.pipeline.score.materialize``).

The scorer writes, per round, the rows ``failures``, ``propagation``, ``root_causes`` (greedy, per
trace and per conversation), ``workflow_scores`` and ``trace_summary`` give with their default
parameters for the traces it scored (whole conversations), into ``tables/materialized_<query>/``,
then one ``materialized_traces`` row per trace (trace, build, round, conversation). A result row
counts when its ``(trace_id, mat_round)`` is the newest round of its trace's latest build; rows of
an older round or build are dead weight for the garbage collector.

A named query reads these rows instead of running its SQL when its parameters are the materialized
ones (``since_ns`` and ``trace_id`` may be anything for the per-trace rows: they only pick traces)
and the store is *fresh*: every latest build has a ``materialized_traces`` row, and the SQL
definitions and human labels are those the newest round saw (``signature``). Otherwise the SQL runs: its
definitions stay the reference, and a test checks that both give the same rows. Between a build and
its materialization (a live round may leave it for later) ``freshness`` names the traces the stored
rows do not answer: one trace they answer is still read from them, and ``store.mixed`` answers
``tracedag query`` with the stored rows of the others plus the SQL over those traces.
"""

from __future__ import annotations

import bisect
import hashlib
import logging
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tracedag import queries
from tracedag.pipeline.store import current_rounds, freshkept, sqlfiles
from tracedag.pipeline.store.cachereads import local_copies, native_reads
from tracedag.pipeline.store.files import parquet_files
from tracedag.pipeline.store.latest import LATEST_BUILDS_SQL
from tracedag.pipeline.store.manifests import source_uris
from tracedag.pipeline.store.remote import remote_of
from tracedag.pipeline.store.sqlfiles import described
from tracedag.queries import macros
from tracedag.schemas.layout import tables_dir

if TYPE_CHECKING:  # store.gc imports this module in the converters, which must not load DuckDB
    import duckdb

logger = logging.getLogger(__name__)

PREFIX = "materialized_"
STATE = "materialized_traces"
SCHEMA_STEM = "schema"
"""``<table>/schema.parquet``: the table's columns without rows, so its view exists while no round
has rows for it (a store without failures); the garbage collector keeps it (``gc.PROTECTED``)."""
HIDDEN = ("build_id", "mat_round", "per")
"""Columns a materialized table adds to its query's: the trace's build, the round, root_causes' per."""
FREE = ("since_ns", "trace_id")
"""Parameters that only pick traces: any value reads the per-trace rows."""


@dataclass(frozen=True)
class Spec:
    """How a named query's materialized rows are read: its ORDER BY, and the ``per`` values stored."""

    order: str
    pers: tuple[str, ...] = ()


SPECS: dict[str, Spec] = {
    "failures": Spec("start_time_unix_nano, trace_id, span_id"),
    "propagation": Spec("trace_id, start_time_unix_nano, span_id", ("trace",)),
    "root_causes": Spec("trace_id, failed_span_id", ("trace", "conversation")),
    "workflow_scores": Spec("start_time_unix_nano, trace_id"),
    "trace_summary": Spec("start_time_unix_nano, trace_id"),
}


def table_name(name: str) -> str:
    """The derived table holding the materialized rows of the named query ``name``."""
    return PREFIX + name


def views() -> tuple[str, ...]:
    """The views reading the stored rows: the state's and each materialized query's (``freshness`` asks that each
    table has files: a round writes state rows, and a ``schema.parquet`` in each query's table even without rows)."""
    return (STATE, *(table_name(n) for n in SPECS))


def reader_tables(name: str) -> tuple[str, ...]:
    """The tables a read of ``name``'s stored rows for one trace or every trace needs views of
    (``views.connect(data, tables=...)``): the builds, the state, its table and the checks of root causes."""
    return ("traces", STATE, table_name(name), "root_cause_checks")


def defaults(name: str) -> dict[str, str]:
    """The header defaults of ``name``'s parameters: the values it is materialized with."""
    return {p.name: p.default for p in described(name).params}


def _same(value: object, default: str, kind: str) -> bool:
    if value is None:
        return False
    if kind in ("double", "bigint", "integer"):
        try:
            return float(str(value)) == float(default)
        except ValueError:
            return False
    return str(value) == default


def matches(name: str, values: dict[str, object]) -> bool:
    """Whether the parameter ``values`` of ``name`` are ones its materialized rows answer."""
    spec = SPECS.get(name)
    if spec is None:
        return False
    doc = described(name)
    per = values.get("per")
    if spec.pers and per not in spec.pers:
        return False
    whole = per == "conversation"  # conversation rows are materialized for the whole store only
    for p in doc.params:
        if p.name == "per" or (p.name in FREE and not whole):
            continue
        if not _same(values.get(p.name), p.default, p.type):
            return False
    return True


def has_rounds(data: Path) -> bool:
    """Whether any materialization round was written to ``data``."""
    return bool(parquet_files(data, STATE))


def definitions_hash() -> str:
    """A hash of the SQL the materialized rows come from (the queries and the shared macros they call), remembered
    while the ``.sql`` files are as they are (``sqlfiles``: ~4 ms CPU a read, 3 per trace first viewed)."""
    def compute() -> str:
        texts = [queries.load(n) for n in (*SPECS, *queries.macro_files())]
        return hashlib.sha256("\0".join(texts).encode()).hexdigest()[:16]
    return sqlfiles.remembered("definitions", compute)


def signature(data: Path) -> str:
    """What a round's rows depend on besides the builds and their scores: the SQL and the human labels."""
    return f"sql={definitions_hash()};labels={labels_signature(data)}"


def labels_signature(data: Path) -> str:
    """What identifies the human labels now (``step_scores/human.parquet``: size and mtime; '' for none)."""
    parts = []
    for f in parquet_files(data, "step_scores"):
        if f.name.endswith("human.parquet"):
            try:
                st = f.stat()
                parts.append(f"{f.name}:{st.st_size}:{st.st_mtime_ns}")
            except OSError:  # listed in a store, not here: its name is all a reader knows
                parts.append(f.name)
    return ";".join(parts)


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


def has_state_view(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether ``con`` has the state's view, i.e. a round was stored when it connected. A round writes its state
    last, so a connection that has it has the view of every stored table too (each has a ``schema.parquet``
    before its first state row). A connection found with it is remembered (a catalog scan costs 0.7-4 ms);
    one without it is asked again (its views may be made again over a store that has a round now)."""
    if _HAS_VIEW.get(con):
        return True
    found = con.execute("select count(*) from duckdb_views() where view_name = ?", [STATE]).fetchall()
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
    unless a round landed meanwhile."""
    import duckdb

    if not all(parquet_files(data, t) for t in views()):  # the store's, not the connection's views: a reader of
        return Freshness(False), True                     # one trace makes only those it reads (show.SHOWN_TABLES)
    try:
        current = current_rounds.register(con, data)
        if current is None:
            return Freshness(False), True
        builds, pinned = _builds_source(con, data, _of(data, files, "traces"))
        pinned = pinned and _state_files(current.listing) == {str(f) for f in _of(data, files, STATE)}
        traces, missing, sig, stale = con.execute(_FRESHNESS_SQL.replace("from traces_all", f"from {builds}")).fetchall()[0]
    except duckdb.BinderException:  # state files of an older layout only: a full round will follow
        return Freshness(False), True
    if str(sig or "") != signature(data):
        return Freshness(False), pinned
    if not missing:
        return Freshness(True), pinned
    if 2 * len(stale) > int(traces):  # the SQL over every trace costs about as much
        return Freshness(False), pinned
    return Freshness(True, tuple(str(t) for t in stale), int(traces)), pinned


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


CURRENT_SQL = f"""
select m.trace_id, max(m.mat_round) as mat_round
from {STATE} m join ({{latest}}) t on t.trace_id = m.trace_id
where m.build_id = t.build_id
group by m.trace_id
"""
"""``(trace_id, mat_round)``: the newest round of each trace's latest build; ``{latest}`` is a relation of
``(trace_id, build_id)`` of the latest builds, one row per trace (``LATEST_BUILDS_SQL``, or a table a reader
made of it). Joined on the trace id alone, then the build compared: a semi join on both cost 1.4x the CPU
(115 -> 82 ms on 1M spans)."""
_ALL_CUR = f"cur as ({CURRENT_SQL.format(latest=LATEST_BUILDS_SQL)})"
_ALL_WIN = "select trace_id from trace_window($since_ns, $trace_id)"
# Every trace: the join with ``cur`` picks them; the parameters are checked (a constant DuckDB folds), not
# joined again (a semi join of every row on cur's ids cost ~10% of a whole read, 16 ms of root_causes on 1M spans).
_WHOLE_WHERE = "cast($since_ns as bigint) = 0 and cast($trace_id as varchar) = ''"
# One trace: its latest build read from traces_all with the id compared alone, so that every scan
# skips the other traces' row groups (through the traces view, DuckDB scanned all of traces_all).
_ONE_CUR = f"""latest as (
    select trace_id, arg_max(build_id, (built_unix_nano, build_id)) as build_id,
           arg_max(start_time_unix_nano, (built_unix_nano, build_id)) as start_time_unix_nano
    from traces_all where trace_id = cast($trace_id as varchar) group by trace_id
),
cur as (
    select m.trace_id, max(m.mat_round) as mat_round
    from {STATE} m join latest t on t.trace_id = m.trace_id and t.build_id = m.build_id
    where m.trace_id = cast($trace_id as varchar)
    group by m.trace_id
)"""
_ONE_WIN = ("select trace_id from latest where coalesce(start_time_unix_nano, 0) >= cast($since_ns as bigint)")


def reader_sql(name: str, one_trace: bool = False, whole: bool = False, skip: str = "", current: str = "") -> str:
    """SQL reading ``name``'s current materialized rows; it binds ``$since_ns``, ``$trace_id`` (and ``$per``).

    ``one_trace``: ``$trace_id`` is a trace id (not ''), compared as such so that the scans skip the
    row groups of other traces (the files are sorted by trace id). ``whole``: the parameters pick
    every trace (``$since_ns`` 0, ``$trace_id`` ''): no window to compute. ``skip``: a relation of
    ``trace_id``s whose rows are left out (computed from the SQL instead, ``store.mixed``). ``current``: a
    relation holding ``CURRENT_SQL``'s rows, for a reader of several queries (else each computes them).
    """
    spec = SPECS[name]
    hidden = ", ".join(HIDDEN if spec.pers else HIDDEN[:2])
    per = "and x.per = cast($per as varchar)" if spec.pers else ""
    cur = _ONE_CUR if one_trace else f"cur as (select * from {current})" if current else _ALL_CUR
    skipped = f" and x.trace_id not in (select trace_id from {skip})" if skip else ""
    every = whole and not one_trace
    win = "" if every else f",\nwin as ({_ONE_WIN if one_trace else _ALL_WIN})"
    return f"""
with {cur}{win}
select x.* exclude ({hidden}){_CURRENT_CHECK if name == "root_causes" else ""}
from {table_name(name)} x
join cur c on c.trace_id = x.trace_id and c.mat_round = x.mat_round
where {_WHOLE_WHERE if every else "x.trace_id in (select trace_id from win)"} {per}{skipped}
order by {', '.join('x.' + c.strip() for c in spec.order.split(','))}
"""


def pinned_sql(name: str) -> str:
    """SQL reading one trace's rows of ``name`` stored by the round ``$mat_round`` (its newest round, known from
    ``current_rounds.lookup``): no scan of the builds or the state. Binds ``$trace_id``, ``$mat_round`` (and
    ``$per``); the table's row groups without the trace are skipped by their statistics."""
    spec = SPECS[name]
    hidden = ", ".join(HIDDEN if spec.pers else HIDDEN[:2])
    per = "and x.per = cast($per as varchar)" if spec.pers else ""
    return f"""
select x.* exclude ({hidden}){_CURRENT_CHECK if name == "root_causes" else ""}
from {table_name(name)} x
where x.trace_id = cast($trace_id as varchar) and x.mat_round = cast($mat_round as bigint) {per}
order by {', '.join('x.' + c.strip() for c in spec.order.split(','))}
"""


_CURRENT_CHECK = """ replace ((select arg_max(k.verdict, k.checked_unix_nano) from root_cause_checks k
                  where k.root_trace_id = x.root_trace_id and k.root_span_id = x.root_span_id) as confirmed)"""
"""root_causes' ``confirmed`` as the checks say now: ``tracedag confirm`` runs after the rows were stored."""


def reader_values(name: str, values: dict[str, object]) -> dict[str, object]:
    """The parameters ``reader_sql(name)`` binds, from the query's ``values``."""
    used = ("since_ns", "trace_id", "per") if SPECS[name].pers else FREE
    return {k: values[k] for k in used}


def scope_flags(values: dict[str, object]) -> tuple[bool, bool]:
    """(one trace, every trace): what ``reader_sql``'s ``one_trace`` and ``whole`` are for these ``values``."""
    one = values.get("trace_id") not in (None, "")
    return one, not one and values.get("since_ns") in (0, None)


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


def _condition(name: str) -> str:
    """SQL over the body macro's parameters: true when they are ones the materialized rows answer."""
    doc = queries.describe(name)
    p = {q.name: macros.PARAM_PREFIX + q.name for q in doc.params}
    fixed = [f"cast({p[q.name]} as {q.type}) is not distinct from {_literal(q)}"
             for q in doc.params if q.name not in FREE and q.name != "per"]
    whole = [f"cast({p[k]} as {t}) = {v}" for k, t, v in (("since_ns", "bigint", "0"), ("trace_id", "varchar", "''"))]
    pers = SPECS[name].pers
    if pers:
        trace = f"cast({p['per']} as varchar) = 'trace'"
        per = f"({trace} or (cast({p['per']} as varchar) = 'conversation' and {' and '.join(whole)}))" \
            if "conversation" in pers else trace
        fixed.append(per)
    return " and ".join(fixed) or "true"


def _literal(param: queries.Param) -> str:
    if param.type == "varchar":
        return "'" + str(param.default).replace("'", "''") + "'"
    return f"cast({param.default} as {param.type})"


SOURCE_PREFIX = "__tracedag_s_"


def switch_statements(name: str) -> list[str]:
    """Make ``name``'s body macro read the materialized rows when its arguments match (else its SQL).

    The original body becomes ``__tracedag_s_<name>``; DuckDB folds the constant condition while
    planning, so only one branch runs.
    """
    macro = macros.build(name)
    inner = macros.inner_name(name)
    source = SOURCE_PREFIX + name
    params = ", ".join(macros.PARAM_PREFIX + u for u in queries.describe(name).used)
    body = macro.body.replace(f"macro {inner}(", f"macro {source}(", 1)
    reader = macros.rename_params(reader_sql(name))
    cond = _condition(name)
    switch = (f"create or replace macro {inner}({params}) as table\n"
              f"select * from ({reader}) where {cond}\n"
              f"union all\nselect * from {source}({params}) where not ({cond})")
    return [body, switch]
