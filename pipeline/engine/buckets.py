"""Bucket math: the traces of a plan cut into tasks of bounded size, each a pruneable range.

A bucket is the traces whose first span arrived in a run of received-time windows, and within
that a contiguous, sorted run of trace ids: its reads are bounded by ``received_from`` ..
``received_to`` (files and row groups outside are skipped on their statistics) and by the
lexicographic range ``lo`` .. ``hi`` of trace_id (pruneable too where the files are sorted), then
exactly by the set of its trace ids. Buckets are cut before any task starts, so a task that Ray
reruns reads and returns exactly what its first attempt would have.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

WINDOW_NS = 3600 * 10**9
"""Received-time window of the buckets (the spans partitions are receive hours)."""

MARGIN_NS = 3600 * 10**9
"""Read this much past a bucket's last arrival: received times come from several collectors'
clocks, and a late span filed in an older file may carry an earlier time than one in a newer."""


@dataclass(frozen=True)
class Bucket:
    """One task's traces: ``trace_ids`` (sorted) within ``lo``..``hi`` (inclusive) and the arrivals to read."""

    index: int
    trace_ids: pa.Array
    lo: str
    hi: str
    spans: int
    received_from: int | None  # None: some trace's first arrival is unknown, read from the beginning
    received_to: int | None  # None: no upper bound

    @property
    def name(self) -> str:
        """The bucket's part of its files' names (``<run id>-b<index>``)."""
        return f"b{self.index:04d}"


def bucket_target(total_spans: int, workers: int, max_spans: int) -> int:
    """Spans per bucket: one bucket per worker, or whole rounds of ``workers`` buckets when one
    per worker would exceed ``max_spans`` (a task's memory bound), all about the same size."""
    workers = max(workers, 1)
    buckets = max(workers, math.ceil(total_spans / max(max_spans, 1)))
    buckets = math.ceil(buckets / workers) * workers
    return max(1, math.ceil(total_spans / buckets))


def plan_buckets(trace_ids: pa.Array, spans: np.ndarray, first: np.ndarray, last: np.ndarray,
                 target_spans: int, window_ns: int = WINDOW_NS, margin_ns: int = MARGIN_NS) -> list[Bucket]:
    """Cut ``trace_ids`` (sorted; their span counts and first and last arrivals, 0 first: unknown) into buckets.

    Traces are ordered by the received-time window of their first arrival, then by trace id, and cut
    into consecutive runs of about ``target_spans`` spans (a trace is never split).
    """
    n = len(trace_ids)
    if n == 0:
        return []
    spans, first, last = (np.asarray(a, dtype=np.int64) for a in (spans, first, last))
    known = first[first > 0]
    base = int(known.min()) if known.size else 0
    window = np.where(first > 0, (first - base) // max(window_ns, 1), -1)
    order = np.argsort(window, kind="stable")  # trace ids stay sorted within a window
    cum = np.cumsum(spans[order])
    group = (cum - spans[order]) // max(target_spans, 1)  # by the first span of each trace
    starts = np.flatnonzero(np.diff(group, prepend=-1))
    ends = np.append(starts[1:], n)
    ids = trace_ids.take(pa.array(order))
    return [_bucket(k, ids.slice(int(a), int(b - a)), order[a:b], spans, first, last, margin_ns)
            for k, (a, b) in enumerate(zip(starts, ends, strict=True))]


def _bucket(k: int, ids: pa.Array, rows: np.ndarray, spans: np.ndarray, first: np.ndarray, last: np.ndarray,
            margin_ns: int) -> Bucket:
    ids = ids.take(pc.array_sort_indices(ids))
    f = first[rows]
    return Bucket(index=k, trace_ids=ids, lo=ids[0].as_py(), hi=ids[-1].as_py(), spans=int(spans[rows].sum()),
                  received_from=None if (f <= 0).any() else int(f.min()),
                  received_to=int(last[rows].max()) + margin_ns)
