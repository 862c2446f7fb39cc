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
its materialization (a live round may leave it for later) ``store.freshness`` names the traces the stored
rows do not answer: one trace they answer is still read from them, and ``store.mixed`` answers
``tracedag query`` with the stored rows of the others plus the SQL over those traces. This module holds
what is materialized and the SQL that reads it; ``store.freshness`` whether and how a query reads it now.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from tracedag import queries
from tracedag.pipeline.store import sqlfiles
from tracedag.pipeline.store.files import parquet_files
from tracedag.pipeline.store.latest import LATEST_BUILDS_SQL
from tracedag.pipeline.store.sqlfiles import described
from tracedag.queries import macros

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
