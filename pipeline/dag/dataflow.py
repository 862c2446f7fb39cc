"""Value provenance for ``tracedag show``: the ``data`` edges into a trace and its silent producer.

``data`` edges (``score.provenance``) go from the step whose output (or the user message) first held an
argument value to the failed step that used it. ``root_causes`` names the producer as the root cause
when the failure says the value is unknown, invalid or not found (``silent_producer``); ``attach``
asks it, for the one trace shown (per trace, greedy, as ``show``'s cause), only when the trace has
data edges, and moves the shown root cause to the producer.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar

import duckdb

from tracedag import queries
from tracedag.pipeline.dag import show_stored
from tracedag.pipeline.store.querying import bind_params


class _Shown(Protocol):
    """What ``attach`` reads of show's ``Cause`` (a dataclass; named here, not imported: show imports us)."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def path(self) -> tuple[str, ...]: ...


C = TypeVar("C", bound=_Shown)


@dataclass(frozen=True)
class DataEdge:
    """A value the step ``dst_span_id`` failed with, first seen at ``src_span_id`` (maybe another turn's trace)."""

    src_trace_id: str
    src_span_id: str
    dst_span_id: str
    data_arg: str
    data_from: str  # output | user


@dataclass(frozen=True)
class Silent:
    """The producer ``root_causes`` names instead of the failed step it fed (``silent_producer``)."""

    producer_span_id: str
    consumer_span_id: str
    data_arg: str
    user: bool  # the user typed the value


_EDGES_SQL = """
select coalesce(src_trace_id, trace_id) as src_trace_id, src_span_id, dst_span_id, data_arg,
       coalesce(data_from, 'output') as data_from
from dag_edges where trace_id = $t and edge_kind = 'data'
order by dst_span_id, data_arg, src_span_id
"""


def data_edges(con: duckdb.DuckDBPyConnection, trace_id: str) -> tuple[DataEdge, ...]:
    """The data edges into the steps of ``trace_id``."""
    rows = con.sql(_EDGES_SQL, params={"t": trace_id}).fetchall()
    return tuple(DataEdge(*(str(v) for v in r)) for r in rows)


def silent_producer(con: duckdb.DuckDBPyConnection, trace_id: str) -> Silent | None:
    """The silent producer ``root_causes`` (per trace, greedy) names for ``trace_id``, if any: read from its
    stored rows when they are current (``show_stored``), else computed."""
    stored = show_stored.silent_statement(con, trace_id)
    if stored is None:
        sql = queries.load("root_causes").strip().rstrip(";")
        values = bind_params(queries.describe("root_causes"), {"trace_id": trace_id, "per": "trace",
                                                                 "strategy": "greedy"})
        stored = show_stored.SILENT_SQL.format(stored=sql), values
    rows = con.sql(stored[0], params=stored[1]).fetchall()
    if not rows:
        return None
    root, failed, arg, step_type = rows[0]
    return Silent(str(root), str(failed), str(arg), step_type == "user")


def attach(con: duckdb.DuckDBPyConnection, trace_id: str, cause: C) -> C:
    """``cause`` with the trace's data edges and, when ``root_causes`` names one, its silent producer as the
    root (the path then starts at the producer, one hop more)."""
    edges = data_edges(con, trace_id)
    if not edges:
        return cause
    silent = silent_producer(con, trace_id)
    if silent is None or silent.consumer_span_id not in cause.path:
        return dataclasses.replace(cause, data=edges)
    path = cause.path[cause.path.index(silent.consumer_span_id):]
    return dataclasses.replace(cause, data=edges, silent=silent, root_span_id=silent.producer_span_id,
                               path=(silent.producer_span_id, *path), hops_from_root=len(path))
