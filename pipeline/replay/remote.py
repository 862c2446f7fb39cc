"""The graph nodes an agent in another process visited, read back from the store its spans land in.

An agent behind a URL is called with the W3C ``traceparent`` of the caller's step (and the run
labels as ``baggage``, ``targets.endpoint_target``); when it extracts them, its spans continue the
caller's trace and reach the store through its own exporter and a collector. :class:`StoreSpans`
reads the spans of given traces from ``spans_all`` (``store.views.connect``; one query a poll for
every trace waited on, shared by the threads of a parallel simulation), and :func:`settled` says
when a trace's remote part is in: some span of the agent is a child of a caller's span (the
agent's entry span, which ends after everything it contains, so its batch is the last), and no
span of the agent names a parent that has not arrived.

Node spans are read with the keys the in-process observer uses (``langgraph_node``,
``gen_ai.node.name``, ``tracedag.node.name``, ``graph.node.name``); a node span whose parent is a
node span is part of that visit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NODE_SQL = """
select trace_id, span_id, parent_span_id, start_time_unix_nano,
       coalesce(langgraph_node, attributes['gen_ai.node.name'], attributes['tracedag.node.name'],
                attributes['graph.node.name']) as node
from spans_all
where trace_id in (select unnest(?::varchar[]))
"""


@dataclass(frozen=True)
class StoredSpan:
    """One span of a waited-on trace as stored: its place in the trace and its node, if it is a node span."""

    trace_id: str
    span_id: str
    parent_span_id: str | None
    start_ns: int
    node: str | None


class StoreSpans:
    """Spans of the traces being waited on, refreshed from the store at most every ``poll`` seconds."""

    def __init__(self, data: Path, poll: float = 0.1) -> None:
        self.data = data
        self.poll = poll
        self._lock = threading.Lock()
        self._pending: set[str] = set()
        self._found: dict[str, dict[str, StoredSpan]] = {}
        self._last = float("-inf")
        self._con: Any = None
        self._globbed = False

    def fetch(self, trace_ids: Collection[str]) -> dict[str, list[StoredSpan]]:
        """The stored spans of ``trace_ids`` (refreshed when the last look is older than ``poll``)."""
        with self._lock:
            self._pending.update(trace_ids)
            if time.monotonic() - self._last >= self.poll:
                self._refresh()
            return {t: list(self._found.get(t, {}).values()) for t in trace_ids}

    def release(self, trace_ids: Iterable[str]) -> None:
        """Stop looking for ``trace_ids`` (their spans are in, or the wait is over)."""
        with self._lock:
            for t in trace_ids:
                self._pending.discard(t)
                self._found.pop(t, None)

    def close(self) -> None:
        """Close the store connection."""
        with self._lock:
            if self._con is not None:
                self._con.close()
                self._con = None

    def _refresh(self) -> None:
        self._last = time.monotonic()
        if not self._pending:
            return
        rows = self._query(sorted(self._pending))
        for trace_id, span_id, parent, start, node in rows:
            node_name = None if node in (None, "__start__", "__end__") else str(node)
            span = StoredSpan(str(trace_id), str(span_id), parent or None, int(start or 0), node_name)
            self._found.setdefault(span.trace_id, {})[span.span_id] = span
        self._last = time.monotonic()

    def _query(self, trace_ids: list[str]) -> list[tuple[Any, ...]]:
        from tracedag.pipeline.store.views import connect

        if self._con is None:
            self._globbed = self._reads_new_files()  # looked at before connecting: the view is made after
            self._con = connect(self.data, threads=1, tables=["spans"])  # NODE_SQL reads spans_all only
        rows: list[tuple[Any, ...]] = self._con.execute(NODE_SQL, [trace_ids]).fetchall()
        if not self._globbed:  # the view lists the files there were: look again next time
            self._con.close()
            self._con = None
        return rows

    def _reads_new_files(self) -> bool:
        """True when the ``spans`` view reads the local files by pattern (new files are seen without
        reconnecting): a local store that had span files when connected."""
        from tracedag.schemas.layout import table_dir

        if "://" in str(self.data):
            return False
        folder = table_dir(self.data, "spans")
        return folder.is_dir() and next(folder.rglob("*.parquet"), None) is not None


def settled(stored: Iterable[StoredSpan], local_span_ids: Collection[str]) -> bool:
    """True when the agent's part of a trace is in: an entry span (child of a caller's span) and no
    span whose parent is missing."""
    remote = {s.span_id: s for s in stored if s.span_id not in local_span_ids}
    if not remote:
        return False
    known = set(remote) | set(local_span_ids)
    entry = any(s.parent_span_id in local_span_ids for s in remote.values())
    return entry and all(s.parent_span_id is None or s.parent_span_id in known for s in remote.values())


def remote_visits(stored: Iterable[StoredSpan], local_span_ids: Collection[str],
                  local_node_spans: Mapping[str, int]) -> list[tuple[int, str, str]]:
    """The agent's node visits in a trace, ``(start ns, span id, node)``: the node spans that did not run
    in this process, without those whose parent is a node span (``local_node_spans``: this process's
    node spans and their start)."""
    remote = [s for s in stored if s.span_id not in local_span_ids]
    node_ids = set(local_node_spans) | {s.span_id for s in remote if s.node is not None}
    return [(s.start_ns, s.span_id, s.node) for s in remote
            if s.node is not None and s.parent_span_id not in node_ids]
