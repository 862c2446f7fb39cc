"""Small, default-off changes to the example agent, to simulate an update of it (regression gate evidence).

Each knob models one kind of release a team ships: ``drop_time_rate`` a prompt change after which
the model sometimes leaves the required ``time_of_day`` argument out of ``calendar_search``;
``skip_availability_rate`` a router change that sometimes goes straight from the details to the
proposal, skipping the calendar search; ``calendar_latency`` a slower (or faster) calendar
service, a factor on its latency; ``rephrase`` reworded replies of about the same length (a
harmless change). A tool that fails more often is ``SimulationConfig.fault_rate``. With every knob
at its default the agent behaves, and draws its random numbers, exactly as without tweaks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from tracedag.schemas.errors import TracedagError


class BadTweak(TracedagError):  # type: ignore[misc,unused-ignore]
    """An ``--agent-opt`` that names no knob or has a value of the wrong type."""


@dataclass(frozen=True)
class Tweaks:
    """Default-off changes to the example agent (see the module docstring)."""

    drop_time_rate: float = 0.0
    skip_availability_rate: float = 0.0
    calendar_latency: float = 1.0
    rephrase: bool = False

    @classmethod
    def from_pairs(cls, pairs: Iterable[str]) -> Tweaks:
        """Parse ``name=value`` strings (``rephrase=true``, ``calendar_latency=3``)."""
        values: dict[str, object] = {}
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for pair in pairs:
            name, sep, text = pair.partition("=")
            field = fields.get(name.strip())
            if not sep or field is None:
                raise BadTweak(f"--agent-opt {pair!r}: expected name=value with name one of {', '.join(fields)}")
            values[field.name] = _parse(field.name, field.type, text.strip())
        return cls(**values)  # type: ignore[arg-type]

    def as_labels(self) -> dict[str, str]:
        """The knobs that differ from their defaults, as text (for logs and run labels)."""
        default = Tweaks()
        return {f.name: str(getattr(self, f.name)) for f in dataclasses.fields(self)
                if getattr(self, f.name) != getattr(default, f.name)}


def _parse(name: str, kind: object, text: str) -> object:
    if kind in (bool, "bool"):
        if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
            raise BadTweak(f"--agent-opt {name}: {text!r} is not a boolean")
        return text.lower() in ("true", "1", "yes")
    try:
        value = float(text)
    except ValueError as e:
        raise BadTweak(f"--agent-opt {name}: {text!r} is not a number") from e
    if value < 0 or (name.endswith("_rate") and value > 1):
        raise BadTweak(f"--agent-opt {name}: {text!r} is out of range")
    return value


REPHRASED: dict[str, tuple[str, ...]] = {
    "router_book": ("Glad to help with a court booking. What day and time?", "Of course! When do you want to play?"),
    "router_info": ("Let me check that for you.", "Good question, just a moment."),
    "ask_again": ("Thank you. At what time do you want to play?", "Could you give me the time too?"),
    "details_ok": ("Noted: {date} at {time}. Looking at the courts.", "Great, {date} at {time}."),
    "availability": ("There are {n} free courts.", "I see {n} courts available."),
    "propose": ("Court {court} is free on {date} at {time}. Book it?", "What about court {court}, {date} {time}?"),
    "accepted": ("Great, I am booking it.", "Booking court {court} now."),
    "declined": ("That is fine.", "Okay, I will not book it."),
    "booked": ("All set! Your booking number is {booking_id}.", "Booked, number {booking_id}."),
    "finalize": ("{summary} Thank you for contacting the club. Goodbye!", "{summary} Enjoy your game. Bye!"),
}
"""Reworded replies of about the same length as ``fake_llm.TEMPLATES`` (``club_info`` stays as is)."""
