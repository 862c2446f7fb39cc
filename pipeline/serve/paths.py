"""The propagation path of a trace: every step from its root cause to its final failure, hop by hop.

``propagation`` gives the failure DAG (``nearest_failing_upstream``: the failures a failure is the
nearest failing downstream of) and ``root_causes`` the root and the final failure. The path is the
longest failure-DAG path from the root to the final failure (it names every failure on the way),
each failure-DAG hop then expanded into the shortest run of dependency edges (``dag_edges``,
upstream -> downstream) between its two failures, so consecutive steps of the path always share a
DAG edge that the web UI can draw. A hop without such a run (cannot happen for a failure DAG built
from the same edges) is kept as a direct hop.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

Row = Mapping[str, Any]


def propagation_path(root_cause: Row | None, failures: Sequence[Row], edges: Sequence[Row]) -> list[str]:
    """Span ids from the root cause to the final failure, consecutive ids joined by a DAG edge.

    Args:
        root_cause: the ``root_causes`` row of the trace (``root_span_id``, ``failed_span_id``), or None.
        failures: the trace's ``propagation`` rows (``span_id``, ``nearest_failing_upstream``).
        edges: the trace's DAG edges (``source`` upstream, ``target`` downstream).

    Returns:
        The path (``[root]`` when the root is the final failure; ``[]`` without a root cause).
    """
    if root_cause is None or not root_cause.get("root_span_id"):
        return []
    root, final = str(root_cause["root_span_id"]), str(root_cause.get("failed_span_id") or root_cause["root_span_id"])
    hops = failure_hops(root, final, failures)
    downstream = _adjacency(edges)
    path = [root]
    for up, down in zip(hops, hops[1:], strict=False):
        path += _shortest(up, down, downstream)[1:]
    return path


def failure_hops(root: str, final: str, failures: Sequence[Row]) -> list[str]:
    """The longest failure-DAG path from ``root`` to ``final`` (``[root, final]`` when none is found)."""
    nearest = {str(f["span_id"]): [str(u) for u in f.get("nearest_failing_upstream") or []] for f in failures}
    best: dict[str, list[str] | None] = {}

    def longest(node: str, seen: frozenset[str]) -> list[str] | None:
        if node == root:
            return [root]
        if node in best:
            return best[node]
        found: list[str] | None = None
        for up in nearest.get(node, []):
            if up in seen:
                continue  # a cycle guard: a failure DAG has none, bad input may
            sub = longest(up, seen | {up})
            if sub is not None and (found is None or len(sub) + 1 > len(found)):
                found = [*sub, node]
        best[node] = found
        return found

    if root == final:
        return [root]
    return longest(final, frozenset({final})) or [root, final]


def _adjacency(edges: Sequence[Row]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for e in edges:
        out.setdefault(str(e["source"]), []).append(str(e["target"]))
    for targets in out.values():
        targets.sort()
    return out


def _shortest(start: str, goal: str, downstream: Mapping[str, list[str]]) -> list[str]:
    """The shortest run of edges from ``start`` to ``goal`` (breadth first), else ``[start, goal]``."""
    back: dict[str, str] = {start: start}
    todo = deque([start])
    while todo:
        node = todo.popleft()
        if node == goal:
            path = [goal]
            while path[-1] != start:
                path.append(back[path[-1]])
            return path[::-1]
        for nxt in downstream.get(node, []):
            if nxt not in back:
                back[nxt] = node
                todo.append(nxt)
    return [start, goal]
