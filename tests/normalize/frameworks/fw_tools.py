"""The tools the framework agents share, with their faults where the scenarios' truth needs them.

Imported by the agent scripts (``*_agent.py``) inside their pinned venvs: plain Python, no framework,
so each framework derives the tool's schema from the same signature and docstring. ``Atlantis``'s
weather always times out, ``Lyon``'s fails once then works (a retry recovers), ``A-2002``'s tracking
number is stale (no carrier knows it: value provenance across turns), ``book_taxi`` rejects a time
that is not ``HH:MM``.
"""

from __future__ import annotations

import re
from typing import Any

CALLS: dict[str, int] = {}
ORDERS = {"A-1001": {"order_id": "A-1001", "status": "shipped", "tracking_no": "TRK-77123"},
          "A-2002": {"order_id": "A-2002", "status": "shipped", "tracking_no": "TRK-31337"}}  # stale: no carrier knows it
SHIPMENTS = {"TRK-77123": "in transit, arriving Friday"}


def get_weather(city: str) -> str:
    """The weather of a city today."""
    CALLS[city] = CALLS.get(city, 0) + 1
    if city == "Atlantis":
        raise TimeoutError("weather backend timed out after 10s")
    if city == "Lyon" and CALLS[city] == 1:
        raise ConnectionError("weather backend connection reset")
    return f"{city}: 21C and sunny"


def lookup_order(order_id: str) -> dict[str, Any]:
    """An order's status and tracking number."""
    return ORDERS.get(order_id) or {"status": "error", "error": f"order {order_id} not found"}


def book_taxi(city: str, time: str) -> str:
    """Book a taxi in a city at a time, HH:MM."""
    if not re.fullmatch(r"\d\d:\d\d", time):
        raise ValueError(f"time must be HH:MM, got {time!r}")
    return f"taxi booked in {city} at {time}"
