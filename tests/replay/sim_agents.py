"""Agents and a tiny agent graph for the simulated-user tests (``tracedag simulate --agent --graph``).

The graph: ``router -> ask | z``, ``ask -> x | y``; terminals x, y, z. Its DFS paths (the intents):
i01 router>ask>x, i02 router>ask>y, i03 router>z.
"""

from __future__ import annotations

from typing import Any

from tracedag import instrument as td

TINY_GRAPH: dict[str, Any] = {
    "version": 1,
    "name": "tiny",
    "nodes": [{"name": n} for n in ("router", "ask", "z", "x", "y")],
    "edges": [
        {"source": "router", "target": "ask", "condition": "I want details"},
        {"source": "router", "target": "z", "condition": "just zed"},
        {"source": "ask", "target": "x", "condition": "pick x"},
        {"source": "ask", "target": "y", "condition": "pick y"},
    ],
    "start": "router",
    "terminals": ["x", "y", "z"],
}


def wrong_branch(history: list[dict[str, Any]]) -> str:
    """Turn 1: router, then z when the user says 'zed', else ask. Turn 2: always x (wrong for intent y)."""
    users = [m for m in history if m["role"] == "user"]
    with td.agent("tiny") as step:
        if len(users) == 1:
            with td.node("router"):
                pass
            nxt = "z" if "zed" in str(users[-1]["content"]).lower() else "ask"
        else:
            nxt = "x"
        with td.node(nxt):
            pass
        step.set_output(f"went to {nxt}")
        return f"went to {nxt}"


def fails_on_zed(history: list[dict[str, Any]]) -> str:
    """``wrong_branch``, except that after the router it raises when the user asked for zed."""
    users = [m for m in history if m["role"] == "user"]
    if len(users) == 1 and "zed" in str(users[-1]["content"]).lower():
        with td.agent("tiny"):
            with td.node("router"):
                pass
            raise RuntimeError("the zed service is down")
    return wrong_branch(history)


def slow_wrong_branch(history: list[dict[str, Any]]) -> str:
    """``wrong_branch``, a quarter of a second a turn (for interrupting a simulation)."""
    import time

    time.sleep(0.25)
    return wrong_branch(history)
