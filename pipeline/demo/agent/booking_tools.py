"""The booking agent's tools: club information, a faulty calendar, and the booking system.

``Calendar`` fails in some runs on purpose: with probability ``fault_rate`` a search raises
``CalendarUnavailable`` (HTTP 503) or ``CalendarTimeout``, drawn from a seeded generator, so the
same seed fails the same calls. The booking system rejects a booking without a valid slot, which
is how a calendar failure propagates to the steps after it.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

CLUB_FACTS: dict[str, str] = {
    "hours": "The club is open 07:00-22:00 on weekdays and 08:00-20:00 at weekends.",
    "prices": "A court costs 18 EUR per hour, 12 EUR before 10:00.",
}
COURTS = (1, 2, 3, 4)


class ToolError(Exception):
    """A tool call failed."""


class CalendarUnavailable(ToolError):
    """The calendar service answered HTTP 503."""


class CalendarTimeout(ToolError, TimeoutError):
    """The calendar service did not answer in time."""


class BookingRejected(ToolError):
    """The booking system refused the request (bad or missing slot)."""


def club_info(topic: str) -> dict[str, str]:
    """Look up a fact about the club (``hours`` or ``prices``)."""
    return {"topic": topic, "answer": CLUB_FACTS.get(topic, CLUB_FACTS["hours"])}


@dataclass
class Calendar:
    """The court calendar; a seeded share of searches fail like a flaky HTTP service."""

    rng: random.Random
    fault_rate: float = 0.25
    latency_scale: float = 1.0
    timeout_s: float = 0.025

    def search(self, date: str | None, time_of_day: str | None = None) -> list[dict[str, Any]]:
        """Free slots on ``date`` around ``time_of_day``; raises on a fault or missing input."""
        draw, kind = self.rng.random(), self.rng.random()
        if draw < self.fault_rate:
            return self._fail(kind)
        _sleep(self.rng, 0.001, 0.004, self.latency_scale)
        if not date or not time_of_day:
            raise ValueError(f"calendar_search needs a date and a time, got {date!r} {time_of_day!r}")
        free = [c for c in COURTS if self.rng.random() < 0.7] or [COURTS[-1]]
        return [{"slot_id": f"court{c}-{date}-{time_of_day}", "court": c, "date": date, "time": time_of_day} for c in free]

    def _fail(self, kind: float) -> list[dict[str, Any]]:
        if kind < 0.5:
            time.sleep(self.timeout_s * self.latency_scale)
            raise CalendarTimeout(f"calendar did not answer within {self.timeout_s * 1000:.0f} ms")
        _sleep(self.rng, 0.002, 0.005, self.latency_scale)
        raise CalendarUnavailable("HTTP 503 Service Unavailable from calendar.example/api/slots")


@dataclass
class BookingSystem:
    """Books slots; remembers the bookings it made."""

    rng: random.Random
    latency_scale: float = 1.0
    bookings: dict[str, str] = field(default_factory=dict)

    def create(self, slot_id: str | None, name: str) -> dict[str, str]:
        """Book ``slot_id`` for ``name``; raises ``BookingRejected`` without a valid slot."""
        _sleep(self.rng, 0.001, 0.003, self.latency_scale)
        if not slot_id or not slot_id.startswith("court"):
            raise BookingRejected(f"400 Bad Request: invalid slot_id {slot_id!r}")
        booking_id = f"B{self.rng.randrange(10_000, 99_999)}"
        self.bookings[booking_id] = slot_id
        return {"booking_id": booking_id, "slot_id": slot_id, "name": name}


def _sleep(rng: random.Random, low: float, high: float, scale: float) -> None:
    if scale > 0:
        time.sleep(rng.uniform(low, high) * scale)
