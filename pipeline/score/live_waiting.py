"""The traces a live collector's store passes wait to store, found from what changed since the last pass.

Each pass of ``LiveStore`` asked two questions of the whole store: which traces' latest build has no stored round
(``materialize._PENDING_SQL``) and every trace of their conversations (``materialize._TRACES_SQL``). Both read every
row of ``traces_all``: on 870k traces 0.77 s and 0.60 s of CPU a pass, however few traces the pass stores, so a
collector that had run for twenty minutes at 10k spans/s spent a core on them.

``Waiting`` answers both from the files the rounds wrote since. A trace's latest build can change only through a
row in a ``traces`` file that is new since the last pass (a build, or a collection's merged file), and a trace that
waited can only have been stored since; so the traces waiting now are among those of the new files and those that
waited, and the SQL asks only about them, over the files that hold them (``mixedkept.files_holding``). Their
conversations: every trace whose latest build has one of their conversation keys has a ``traces`` row with that key,
so the files holding such a row (each file's conversation keys are read once, as its trace ids are:
``store.conversation_keys``, ``store.fileids``) hold every candidate, whose latest build is then read from the files
holding it. The first pass of a process asks the whole store, as before, and so does every pass over an object
store.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa

from tracedag.pipeline.score import materialize as m
from tracedag.pipeline.store import conversation_keys, fileids
from tracedag.pipeline.store import materialized as mat
from tracedag.pipeline.store.fetch import arrow
from tracedag.pipeline.store.files import parquet_files
from tracedag.pipeline.store.latest import LATEST_CONVERSATIONS_SQL
from tracedag.pipeline.store.mixed import narrowed
from tracedag.pipeline.store.remote import remote_of

Stamp = fileids.Stamp
CANDIDATES = "__tracedag_waiting_candidates"

# The traces of ``CANDIDATES`` whose latest build (over the ``{traces}`` rows that hold them all) has no stored round.
_WAITING_SQL = f"""
with t as ({LATEST_CONVERSATIONS_SQL.replace("from traces_all", "from {traces}")})
select t.trace_id from t
where not exists (select 1 from {mat.STATE} s
                  where s.trace_id = t.trace_id and s.build_id = t.build_id
                    and s.trace_id in (select trace_id from {CANDIDATES}))
"""

# ``_TRACES_SQL``'s rows over the ``{traces}`` rows of every candidate trace (all their builds), for the conversations
# of the scope's traces.
_STATE_SQL = f"""
with t as materialized ({LATEST_CONVERSATIONS_SQL.replace("from traces_all", "from {traces}")})
select t.trace_id, t.build_id, coalesce(t.conversation_id, t.trace_id) as conversation_key,
       cast(? as bigint) as mat_round, cast(? as varchar) as signature
from t
where coalesce(t.conversation_id, t.trace_id) in (
    select coalesce(conversation_id, trace_id) from t where trace_id in (select trace_id from {m.SCOPE}))
"""

class Waiting:
    """What a ``LiveStore`` waits to store, kept from pass to pass: the ``traces`` files seen, the traces waiting."""

    def __init__(self, data: Path) -> None:
        self.data = data
        self.seen: frozenset[Stamp] | None = None
        self.waiting: tuple[str, ...] = ()

    def traces(self, con: duckdb.DuckDBPyConnection) -> pa.Table:
        """The traces whose latest build has no stored round (``trace_id``), as ``materialize._PENDING_SQL``."""
        now = _stamps(self.data)
        if self.seen is None or remote_of(self.data) is not None:
            found = arrow(con, m._PENDING_SQL)
        else:
            candidates = set(self.waiting) | fileids.ids_of(now - self.seen)
            found = self._among(con, sorted(candidates))
        self.seen, self.waiting = now, tuple(str(t) for t in found.column("trace_id").to_pylist())
        return found

    def _among(self, con: duckdb.DuckDBPyConnection, candidates: list[str]) -> pa.Table:
        if not candidates:
            return pa.table({"trace_id": pa.array([], pa.string())})
        con.register(CANDIDATES, pa.table({"trace_id": pa.array(candidates, pa.string())}))
        traces = narrowed(con, self.data, CANDIDATES, ["traces"])["traces"]
        return arrow(con, _WAITING_SQL.format(traces=traces))

    def state(self, con: duckdb.DuckDBPyConnection, signature: str) -> pa.Table:
        """``materialize._TRACES_SQL``'s rows (round 0) for the traces registered as ``materialize.SCOPE``: every trace
        of their conversations, by the latest build of each; the whole store on a first pass or an object store."""
        if self.seen is None or remote_of(self.data) is not None:
            return arrow(con, m._TRACES_SQL, [0, signature])
        scope = [str(t) for t in con.sql(f"select trace_id from {m.SCOPE}").fetchnumpy()["trace_id"]]
        con.register(CANDIDATES, pa.table({"trace_id": pa.array(scope, pa.string())}))
        first = narrowed(con, self.data, CANDIDATES, ["traces"])["traces"]
        members = conversation_keys.members(_stamps(self.data), _keys_of(con, first))
        con.register(CANDIDATES, pa.table({"trace_id": pa.array(sorted(set(scope) | members), pa.string())}))
        every = narrowed(con, self.data, CANDIDATES, ["traces"])["traces"]
        return arrow(con, _STATE_SQL.format(traces=every), [0, signature])


def _keys_of(con: duckdb.DuckDBPyConnection, traces: str) -> pa.Array:
    """The conversation keys of the latest builds of the ``CANDIDATES`` traces, over ``traces`` (rows holding them)."""
    latest = LATEST_CONVERSATIONS_SQL.replace("from traces_all", f"from {traces}")
    found = arrow(con, f"select distinct coalesce(conversation_id, trace_id) as k from ({latest}) "
                       f"where trace_id in (select trace_id from {CANDIDATES})")
    return found.column("k").combine_chunks()


def _stamps(data: Path) -> frozenset[Stamp]:
    return frozenset(fileids.stamps(parquet_files(data, "traces")))
