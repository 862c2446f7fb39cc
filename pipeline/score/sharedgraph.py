"""The failure graph computed once for every named query a materialization round stores.

The stored queries (``store.materialized.SPECS``) all call the table macros of ``queries/_failure_graph.sql``
with the same defaults: ``failure_steps`` (called by each of the six results, directly or through
``failure_dag``), ``failure_dag`` (propagation, root causes, trace summary) and ``failure_dag_roots`` (root
causes per trace, trace summary). Run one after the other, each query recomputes them: on 200k spans the
six queries took 14 s of CPU, of which two thirds went into the same three macros.

``shared_failure_graph(con)`` computes those three once over the connection's views (every trace they show:
the whole store, or the part a round copied), keeps them in temporary tables, and makes the macros read
those tables for the traces asked. The calls the tables do not hold keep their own definitions: across
turns (``p_across_turns`` true, the root causes per conversation) the originals run, under other names, over
the kept failure steps; ``across_turns`` makes such a call fail instead, for the queries within traces, which
then bind the kept rows alone (``materialize.result_rows``). The kept rows are the macros' rows for every trace,
and each macro's rows for a trace depend on that trace alone (across turns: on its conversation, which is not
kept), so a query reads the rows it would have computed. A call with another threshold or bound than the defaults the tables were
computed with fails loudly rather than read them. On leaving, the original macros are made again and the
tables dropped: the connection answers as before.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import duckdb

from tracedag import queries
from tracedag.pipeline.store import materialized as mat

MACROS = "_failure_graph"
KEPT = "__tracedag_shared_"
IDS = "(select list(trace_id) from traces)"
_STEPS = "failure_steps(p_fail_threshold, p_trace_ids)"
_GRAPH = "(p_fail_threshold, p_trace_ids, p_max_hops, p_across_turns)"


def shared_defaults() -> tuple[float, int] | None:
    """The (fail_threshold, max_hops) every stored query defaults to; None when they differ (nothing shared)."""
    headers = [mat.defaults(name) for name in mat.SPECS]  # each header parsed once (~1.5 ms each)
    found = {(given.get("fail_threshold"), given.get("max_hops", "1000")) for given in headers}
    if len(found) != 1:
        return None
    threshold, hops = found.pop()
    return (float(threshold), int(hops)) if threshold is not None and hops is not None else None


def _guard(param: str, value: float) -> str:
    """SQL: true when ``param`` is ``value``, else an error naming both (a call the kept rows cannot answer)."""
    return (f"(case when cast({param} as double) = {value!r} then true "
            f"else error('shared failure graph: {param} is not {value!r}') end)")


def _statement(text: str, name: str) -> str:
    """The ``create macro`` statement of ``name`` in ``text`` (without its ``;``)."""
    found = re.search(rf"create or replace macro {name}\(.*?\) as table\b.*?;\s*$", text, re.S | re.M)
    if found is None:
        raise LookupError(f"{MACROS}.sql has no macro {name}")
    return found.group(0).rstrip().removesuffix(";")


def _original(text: str, name: str) -> str:
    """The ``create macro`` statement of ``name`` in ``text``, made under the name ``__tracedag_shared_<name>``."""
    return _statement(text, name).replace(f"macro {name}(", f"macro {KEPT}{name}(", 1)


# The connections ``keep_originals`` made the originals on (they stay there: ``unshare`` leaves them).
_KEPT_ON: weakref.WeakSet[duckdb.DuckDBPyConnection] = weakref.WeakSet()


def _keep_graph(con: duckdb.DuckDBPyConnection, name: str, threshold: float, hops: int, source: str | None = None) -> None:
    """Keep ``name``'s rows within each trace (computed by the macro ``source``, ``name`` itself by default); the
    macro reads them, within traces only (``across_turns``)."""
    con.execute(f"create or replace temp table {KEPT}{name}_rows as "
                f"from {source or name}({threshold!r}, {IDS}, {hops}, false)")
    con.execute(_graph_macro(name, threshold, hops, across_turns=False))


def _graph_macro(name: str, threshold: float, hops: int, across_turns: bool) -> str:
    """The statement making ``name`` read its kept rows within traces; ``across_turns``: the original (under its
    kept name) answers a call across turns, else such a call fails (and the original is not bound at all)."""
    kept = (f"select * from {KEPT}{name}_rows where trace_id in (select unnest(p_trace_ids)) "
            f"and {_guard('p_fail_threshold', threshold)} and {_guard('p_max_hops', hops)}")
    if not across_turns:
        return (f"create or replace macro {name}{_GRAPH} as table {kept} and (case when p_across_turns then "
                f"error('shared failure graph: {name} is shared within traces only (sharedgraph.across_turns)') "
                f"else true end)")
    return (f"create or replace macro {name}{_GRAPH} as table {kept} and not p_across_turns "
            f"union all by name select * from {KEPT}{name}{_GRAPH} where p_across_turns")


GRAPH_MACROS = ("failure_steps", "failure_dag", "failure_dag_roots")

# The connections whose graph macros read kept rows: the defaults they were kept with, and whether the macros
# run the originals across turns (``across_turns``).
_SHARED: weakref.WeakKeyDictionary[duckdb.DuckDBPyConnection, tuple[float, int, bool]] = weakref.WeakKeyDictionary()


def across_turns(con: duckdb.DuckDBPyConnection, needed: bool) -> None:
    """On a shared connection, make the two graph macros answer calls across turns (``needed``: the originals run
    for them) or not (a call across turns fails). A query binds every macro its SQL reaches, whatever the rows
    asked: within traces only, a stored query binds the kept rows alone, not the whole original graph (~40-50 ms
    of planning each on a small store). Nothing on a connection not shared, or already so."""
    found = _SHARED.get(con)
    if found is None or found[2] == needed:
        return
    threshold, hops, _ = found
    con.execute(";\n".join(_graph_macro(name, threshold, hops, needed) for name in GRAPH_MACROS[1:]))
    _SHARED[con] = (threshold, hops, needed)


def share(con: duckdb.DuckDBPyConnection) -> bool:
    """Compute the failure graph once over ``con``'s views and make the macros read it (see the module);
    False when the stored queries' defaults differ (the macros are left as they are). The originals are kept
    under their own names the first time (``keep_originals``), so that a connection shares part after part
    without making the macros of ``_failure_graph.sql`` again: the kept rows are computed by the originals
    (``reshare``), whatever an earlier part left the public macros reading."""
    found = shared_defaults()  # once a part: each read parses every stored query's header
    if found is None or (con not in _KEPT_ON and not keep_originals(con, found)):
        return False
    return reshare(con, found)


def _keep_steps(con: duckdb.DuckDBPyConnection, threshold: float, source: str) -> None:
    """Keep ``failure_steps``' rows of every trace (computed by the macro ``source``) and make the macro read them."""
    con.execute(f"create or replace temp table {KEPT}failure_steps_rows as from {source}({threshold!r}, {IDS})")
    con.execute(f"create or replace macro {_STEPS} as table select * from {KEPT}failure_steps_rows "
                f"where trace_id in (select unnest(p_trace_ids)) and {_guard('p_fail_threshold', threshold)}")



def keep_originals(con: duckdb.DuckDBPyConnection, found: tuple[float, int] | None = None) -> bool:
    """For a connection kept across rounds (``score.live_store``): make the three originals once under the names
    ``__tracedag_shared_<name>``, so that each round's ``reshare`` computes the kept rows from them without making
    every macro of ``_failure_graph.sql`` again (``share``'s fixed cost). False when the stored queries' defaults
    differ (nothing is shared then). ``found``: ``shared_defaults()``, when the caller has read them."""
    if (found or shared_defaults()) is None:
        return False
    text = queries.load(MACROS)
    con.execute(";\n".join(_original(text, name) for name in GRAPH_MACROS))
    _KEPT_ON.add(con)
    return True


def reshare(con: duckdb.DuckDBPyConnection, found: tuple[float, int] | None = None) -> bool:
    """``share`` on a connection ``keep_originals`` prepared, kept shared between rounds: the kept rows again over
    ``con``'s views now, each computed by its original (the originals call the macros before them in the graph by
    name, which read the rows just kept), the macros made to read them. False when nothing is shared. ``found``:
    ``shared_defaults()``, when the caller has read them."""
    found = found or shared_defaults()
    if found is None:
        return False
    threshold, hops = found
    _keep_steps(con, threshold, f"{KEPT}failure_steps")
    _SHARED.pop(con, None)
    for name in GRAPH_MACROS[1:]:  # in this order: the roots read the kept graph (binding it alone)
        _keep_graph(con, name, threshold, hops, source=f"{KEPT}{name}")
    _SHARED[con] = (threshold, hops, False)
    across_turns(con, True)  # every call answered, as the originals do
    return True


def unshare(con: duckdb.DuckDBPyConnection, restore: bool = True) -> None:
    """Make the original macros again and drop the kept rows (only the three ``share`` replaces: making every macro
    of ``_failure_graph.sql`` costs ~35 ms CPU, these ~20 ms). ``restore`` False: only drop the rows, for a
    connection closed next (the three macros then fail where called, reading the rows dropped)."""
    _SHARED.pop(con, None)
    text = queries.load(MACROS)
    made = [_statement(text, name) for name in GRAPH_MACROS] if restore else []
    con.execute(";\n".join([*made, *(f"drop table if exists {KEPT}{name}_rows" for name in GRAPH_MACROS)]))


@contextmanager
def shared_failure_graph(con: duckdb.DuckDBPyConnection, restore: bool = True) -> Iterator[Callable[[], bool]]:
    """``share``, given to call once for each part of a round over ``con``'s views as they are then, and ``unshare``
    on leaving (whatever happened in between): the originals are made again once a round, not once a part
    (``restore`` False: not at all, for a connection closed next)."""
    try:
        yield lambda: share(con)
    finally:
        unshare(con, restore)
