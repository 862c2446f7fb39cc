"""The tennis-court booking agent's graph: nodes, allowed transitions, start and terminal.

Two variants of the same agent:

- ``constrained``: only the transitions the designer meant (router -> info or details,
  details -> details (re-ask) or availability, ...); the model chooses only at real branch points;
- ``permissive``: every transition is allowed, so the model may wander anywhere at every step.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

logger = logging.getLogger(__name__)

Variant = Literal["constrained", "permissive"]
VARIANTS: tuple[Variant, ...] = ("constrained", "permissive")
AGENT_NAME = "court_booking"

START = "router"
TERMINALS = ("finalize",)
NODES: dict[str, str] = {
    "router": "read the first message and pick the topic: club information or a booking",
    "club_info": "answer a question about the club (hours, prices) with the club_info tool",
    "ask_details": "collect the date and time; re-ask while one is missing",
    "check_availability": "search free courts with the calendar_search tool",
    "propose_slot": "propose the best free slot and ask the user to confirm",
    "book_court": "book the confirmed slot with the create_booking tool",
    "finalize": "close the conversation with a summary",
}
CONSTRAINED_EDGES: dict[str, tuple[str, ...]] = {
    "router": ("club_info", "ask_details"),
    "club_info": ("finalize",),
    "ask_details": ("ask_details", "check_availability"),
    "check_availability": ("propose_slot",),
    "propose_slot": ("book_court", "finalize"),
    "book_court": ("finalize",),
    "finalize": (),
}
CONDITIONS: dict[tuple[str, str], str] = {
    ("router", "club_info"): "the user asks about the club",
    ("router", "ask_details"): "the user wants to book",
    ("ask_details", "ask_details"): "date or time still missing",
    ("ask_details", "check_availability"): "date and time known",
    ("propose_slot", "book_court"): "the user accepts",
    ("propose_slot", "finalize"): "the user declines",
}


def agent_name(variant: Variant) -> str:
    """The ``gen_ai.agent.name`` of a variant, e.g. ``court_booking.constrained``."""
    return f"{AGENT_NAME}.{variant}"


def allowed(variant: Variant, node: str) -> tuple[str, ...]:
    """Nodes the agent may move to after ``node`` (empty at a terminal)."""
    if node in TERMINALS:
        return ()
    if variant == "constrained":
        return CONSTRAINED_EDGES[node]
    return tuple(n for n in NODES if n != START)


def edges(variant: Variant) -> list[tuple[str, str]]:
    """Every allowed transition of a variant, in a stable order."""
    return [(src, dst) for src in NODES for dst in allowed(variant, src)]


def agent_graph(variant: Variant) -> dict[str, Any]:
    """The agent graph of a variant in the agent-graph DSL JSON (``schemas/agent_graph.schema.json``)."""
    return {
        "version": 1,
        "name": agent_name(variant),
        "description": f"Tennis-court booking agent, {variant} transitions",
        "nodes": [{"name": n, "description": d} for n, d in NODES.items()],
        "edges": [_edge(src, dst) for src, dst in edges(variant)],
        "start": START,
        "terminals": list(TERMINALS),
    }


def _edge(src: str, dst: str) -> dict[str, str]:
    edge = {"source": src, "target": dst}
    if (src, dst) in CONDITIONS:
        edge["condition"] = CONDITIONS[(src, dst)]
    return edge
