"""Call-tree arithmetic over many traces at once, on numpy index arrays.

Every array is indexed by the row number of a span in one chunk; rows are sorted by
``(trace_id, start, span_id)`` so the rows of one trace are contiguous. ``parent[i]`` is the row
of the call-tree parent or ``-1`` for a root. Work is done level by level (one vectorized step
per tree depth), never span by span.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

logger = logging.getLogger(__name__)

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


def ranges(starts: IntArray, ends: IntArray) -> IntArray:
    """Concatenate ``arange(s, e)`` for each pair, vectorized."""
    lens = ends - starts
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.cumsum(lens) - lens
    return np.repeat(starts - offsets, lens) + np.arange(total, dtype=np.int64)


@dataclass(frozen=True)
class Levels:
    """Depth of each row (-1 when unreachable from a root) and the rows of each depth."""

    depth: IntArray
    by_depth: list[IntArray]
    component: IntArray  # row of the root each row hangs under (-1 when unreachable)


def levels(parent: IntArray) -> Levels:
    """Breadth-first levels of the forest given by ``parent`` (rows on a parent cycle stay at -1)."""
    n = parent.size
    has = parent >= 0
    child_order = np.argsort(np.where(has, parent, n), kind="stable").astype(np.int64)
    counts = np.bincount(parent[has], minlength=n)
    ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    depth = np.full(n, -1, dtype=np.int64)
    component = np.full(n, -1, dtype=np.int64)
    frontier = np.flatnonzero(~has).astype(np.int64)
    depth[frontier] = 0
    component[frontier] = frontier
    by_depth: list[IntArray] = []
    d = 0
    while frontier.size:
        by_depth.append(frontier)
        kids = child_order[ranges(ptr[frontier], ptr[frontier + 1])]
        d += 1
        depth[kids] = d
        component[kids] = component[parent[kids]]
        frontier = kids
    return Levels(depth, by_depth, component)


def cycle_members(parent: IntArray, depth: IntArray) -> list[int]:
    """Return one row on each parent cycle (rows unreachable from any root), the earliest-sorted one."""
    unreached = set(np.flatnonzero(depth < 0).tolist())
    picked: list[int] = []
    seen: set[int] = set()
    for start in sorted(unreached):
        if start in seen:
            continue
        path: list[int] = []
        at = start
        while at not in seen and at >= 0:
            seen.add(at)
            path.append(at)
            at = int(parent[at])
        if at in path:  # closed a new cycle: break it at its smallest row
            picked.append(min(path[path.index(at) :]))
    return picked


def attach_orphans(
    orphans: IntArray,
    trace_lo: IntArray,
    trace_hi: IntArray,
    main: BoolArray,
    depth: IntArray,
    start: IntArray,
    end: IntArray,
) -> IntArray:
    """For each orphan, the row that encloses its start most tightly among rows under a true root (-1 if none)."""
    out = np.full(orphans.size, -1, dtype=np.int64)
    for k, o in enumerate(orphans.tolist()):
        lo, hi = int(trace_lo[o]), int(trace_hi[o])
        s = start[o]
        cand = np.flatnonzero(main[lo:hi] & (start[lo:hi] <= s) & (end[lo:hi] >= s)) + lo
        if cand.size:
            # deepest container first, then the shortest one, then the first row
            best = np.lexsort((cand, end[cand] - start[cand], -depth[cand]))[0]
            out[k] = cand[best]
    return out


def clamp_skew(
    parent: IntArray, by_depth: list[IntArray], start: IntArray, end: IntArray, tolerance: int,
    remote: BoolArray | None = None,
) -> tuple[IntArray, IntArray, BoolArray]:
    """Shift subtrees into their parent's interval; flag shifts beyond tolerance.

    A ``remote`` row (the first span of another service under the call that reached it: a SERVER
    span, or a span under a CLIENT span, of another ``service.name``) that starts outside its
    parent's interval (beyond ``tolerance``) ran on another clock (a server span may end after its
    client span, the response being flushed first; it cannot start outside it): its subtree is shifted so that
    it is centred in the parent (the network time split evenly between request and response, as
    NTP and Jaeger's clock-skew adjuster assume), or starts with it when it lasted longer. Any
    other subtree that starts before its parent is shifted to the parent's start. Returns
    effective start, effective end and the clock_skew flag. A shift keeps durations.
    """
    shift = np.zeros(start.size, dtype=np.int64)
    skew = np.zeros(start.size, dtype=np.bool_)
    for rows in by_depth[1:]:
        p = parent[rows]
        base = start[rows] + shift[p]
        p_start, p_end = start[p] + shift[p], end[p] + shift[p]
        extra = np.maximum(0, p_start - base)
        if remote is not None and remote[rows].any():
            dur = end[rows] - start[rows]
            outside = (base < p_start - tolerance) | (base > p_end + tolerance)
            centred = p_start + np.maximum(0, (p_end - p_start - dur) // 2) - base
            extra = np.where(remote[rows] & outside, centred, extra)
        shift[rows] = shift[p] + extra
        skew[rows] = np.abs(extra) > tolerance
    return start + shift, end + shift, skew


def subtree_sizes(parent: IntArray, by_depth: list[IntArray]) -> IntArray:
    """Number of rows in each row's subtree, itself included."""
    size = np.ones(parent.size, dtype=np.int64)
    for rows in reversed(by_depth[1:]):
        np.add.at(size, parent[rows], size[rows])
    return size


def nested_sets(
    parent: IntArray, by_depth: list[IntArray], sibling_order: IntArray, group: IntArray
) -> tuple[IntArray, IntArray]:
    """Nested-set bounds per trace (pre-order entry/exit counters starting at 0).

    ``sibling_order`` lists all rows sorted by (group, sibling rank); ``group`` is the sibling group of
    each row (roots of one trace share a group).
    """
    size = subtree_sizes(parent, by_depth)
    sz2 = 2 * size[sibling_order]
    cs = np.cumsum(sz2) - sz2
    g = group[sibling_order]
    first = np.ones(g.size, dtype=np.bool_)
    first[1:] = g[1:] != g[:-1]
    group_base = np.maximum.accumulate(np.where(first, np.arange(g.size), 0))
    offset = np.empty(parent.size, dtype=np.int64)
    offset[sibling_order] = cs - cs[group_base]
    left = np.empty(parent.size, dtype=np.int64)
    left[by_depth[0]] = offset[by_depth[0]]
    for rows in by_depth[1:]:
        left[rows] = left[parent[rows]] + 1 + offset[rows]
    return left, left + 2 * size - 1


def rank_within(trace: IntArray, key: IntArray) -> IntArray:
    """0-based rank of each row by ``key`` within its trace."""
    order = np.lexsort((key, trace))
    t = trace[order]
    first = np.ones(t.size, dtype=np.bool_)
    first[1:] = t[1:] != t[:-1]
    base = np.maximum.accumulate(np.where(first, np.arange(t.size), 0))
    out = np.empty(trace.size, dtype=np.int64)
    out[order] = np.arange(t.size) - base
    return out


def resolve_pointers(ptr: IntArray) -> IntArray:
    """Follow ``ptr`` chains to their fixed points (pointer jumping)."""
    cur = ptr.copy()
    while True:
        nxt = cur[cur]
        if np.array_equal(nxt, cur):
            return cur
        cur = nxt
