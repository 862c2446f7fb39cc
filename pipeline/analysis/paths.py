"""Depth-first enumeration of the conversation paths of an agent graph.

A path starts at an entry node and is emitted each time it reaches a terminal node; the search
goes on past a terminal that has outgoing edges (a terminal may also be passed through). Loops are
bounded by ``max_visits``: no node appears more than ``max_visits`` times in one path, so
``max_visits=1`` gives the simple paths and ``2`` takes every loop at most once more. Nodes not
reachable from an entry never appear. Successors are explored in edge declaration order, so the
output order is stable.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from tracedag.schemas.agent_graph import AgentGraph
from tracedag.schemas.errors import TracedagError

logger = logging.getLogger(__name__)


class TooManyPaths(TracedagError):  # type: ignore[misc,unused-ignore]
    """The enumeration passed the path limit."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"more than {limit} paths; lower --max-visits or raise --limit")
        self.limit = limit


def enumerate_paths(graph: AgentGraph, max_visits: int = 1) -> Iterator[list[str]]:
    """Yield every start -> terminal path with each node visited at most ``max_visits`` times."""
    if max_visits < 1:
        raise ValueError("max_visits must be >= 1")
    terminals = set(graph.terminals)
    for entry in graph.start:
        yield from _dfs(graph, entry, terminals, max_visits)


def _dfs(graph: AgentGraph, entry: str, terminals: set[str], max_visits: int) -> Iterator[list[str]]:
    """Iterative DFS from ``entry``: a stack of successor iterators beside the current path."""
    path = [entry]
    visits: Counter[str] = Counter({entry: 1})
    stack = [iter(graph.successors(entry))]
    if entry in terminals:
        yield list(path)
    while stack:
        nxt = next(stack[-1], None)
        if nxt is None:
            stack.pop()
            visits[path.pop()] -= 1
            continue
        if visits[nxt] >= max_visits:
            continue
        path.append(nxt)
        visits[nxt] += 1
        stack.append(iter(graph.successors(nxt)))
        if nxt in terminals:
            yield list(path)


def count_paths(graph: AgentGraph, max_visits: int = 1) -> int:
    """Number of paths ``enumerate_paths`` yields."""
    return sum(1 for _ in enumerate_paths(graph, max_visits))


def write_paths(graph: AgentGraph, out: Path, max_visits: int = 1, limit: int = 1_000_000) -> int:
    """Write the paths as JSON lines ``{"index", "length", "path"}``; return how many."""
    n = 0
    tmp = Path(out).with_name(Path(out).name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for n, path in enumerate(enumerate_paths(graph, max_visits), start=1):
            if n > limit:
                fh.close()
                tmp.unlink()
                raise TooManyPaths(limit)
            fh.write(json.dumps({"index": n - 1, "length": len(path), "path": path}) + "\n")
    tmp.replace(out)
    logger.info("wrote %d paths to %s", n, out)
    return n
