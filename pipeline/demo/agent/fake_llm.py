"""A scripted, seeded, stochastic stand-in for a chat model (no network).

It "understands" user messages with keyword rules, writes replies from a few templates, and picks
the next graph node: the node its policy intends, except that each other allowed node is a chance
of ``noise`` to be taken by mistake (the more options a prompt offers, the more the model errs).
With one allowed transition there is nothing to choose, which is why the constrained agent comes
out more deterministic than the permissive one.
"""

from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

logger = logging.getLogger(__name__)

MODEL = "scripted-court-llm-1"
PROVIDER = "tracedag.fake"

_INFO_WORDS = ("hours", "open", "price", "cost")
_BOOK_WORDS = ("book", "reserve", "court", "play")
_DAYS = ("today", "tomorrow", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_TIME = re.compile(r"\b(\d{1,2})(?::(\d{2}))?\s*(am|pm)\b|\b(\d{1,2}):(\d{2})\b", re.IGNORECASE)
_YES = ("yes", "sure", "sounds good", "ok", "go ahead")

TEMPLATES: dict[str, tuple[str, ...]] = {
    "router_book": ("Happy to help you book a court. Which day and time?", "Sure! When would you like to play?"),
    "router_info": ("Let me look that up for you.", "Good question, one moment."),
    "club_info": ("{answer}", "Here you go: {answer}"),
    "ask_again": ("Thanks. And at what time would you like to play?", "Could you tell me the time as well?"),
    "details_ok": ("Got it: {date} at {time}. Checking the courts.", "Perfect, {date} at {time}."),
    "availability": ("I found {n} free courts.", "There are {n} courts available."),
    "propose": ("Court {court} on {date} at {time} is free. Shall I book it?", "How about court {court}, {date} {time}?"),
    "accepted": ("Great, booking it now.", "Booking court {court} for you."),
    "declined": ("No problem.", "Alright, I will not book it."),
    "booked": ("Done! Your booking number is {booking_id}.", "Booked: {booking_id}."),
    "finalize": ("{summary} Thanks for contacting the club. Goodbye!", "{summary} Have a great game. Bye!"),
}


@dataclass(frozen=True)
class Understanding:
    """What the fake model reads from one user message."""

    intent: str | None
    topic: str | None
    date: str | None
    time: str | None
    accepts: bool | None


@dataclass(frozen=True)
class Completion:
    """One fake model reply."""

    text: str
    input_tokens: int
    output_tokens: int
    finish_reason: str


class ScriptedLLM:
    """Seeded fake chat model: keyword understanding, template replies, noisy routing."""

    def __init__(self, rng: random.Random, *, noise: float = 0.04, latency_scale: float = 1.0,
                 templates: Mapping[str, tuple[str, ...]] | None = None) -> None:
        self.rng = rng
        self.noise = noise
        self.latency_scale = latency_scale
        self.templates = {**TEMPLATES, **(templates or {})}

    def understand(self, message: str) -> Understanding:
        """Read intent, topic, date, time and yes/no from a user message."""
        text = message.lower()
        intent = "info" if any(w in text for w in _INFO_WORDS) else None
        if intent is None and any(w in text for w in _BOOK_WORDS):
            intent = "book"
        topic = "prices" if ("price" in text or "cost" in text) else "hours" if intent == "info" else None
        date = next((d for d in _DAYS if d in text), None)
        accepts = True if text.startswith(_YES) else False if text.startswith("no") else None
        return Understanding(intent, topic, date, _parse_time(message), accepts)

    def complete(self, prompt: Sequence[str], template: str, **facts: object) -> Completion:
        """Write a reply from one of the template's phrasings (an empty reply for an empty template)."""
        self._think()
        options = self.templates.get(template, ("",))
        text = self.rng.choice(options).format(**facts) if template else ""
        words_in = sum(len(p.split()) for p in prompt)
        return Completion(text, 40 + 2 * words_in, max(1, len(text.split()) * 4 // 3), "stop")

    def choose(self, intended: str, allowed: Sequence[str]) -> str:
        """The next node: ``intended``, or by mistake (``noise`` per other option) another allowed one."""
        if not allowed:
            return intended
        mistake = min(0.5, self.noise * (len(allowed) - 1))
        if intended in allowed and self.rng.random() >= mistake:
            return intended
        others = [n for n in allowed if n != intended] or list(allowed)
        return self.rng.choice(others)

    def tool_call_id(self) -> str:
        """A tool-call id as a model would return it."""
        return f"call_{self.rng.getrandbits(40):010x}"

    def _think(self) -> None:
        if self.latency_scale > 0:
            time.sleep(self.rng.uniform(0.002, 0.006) * self.latency_scale)


def _parse_time(message: str) -> str | None:
    match = _TIME.search(message)
    if match is None:
        return None
    if match.group(4) is not None:
        return f"{int(match.group(4)):02d}:{match.group(5)}"
    hour = int(match.group(1)) % 12 + (12 if match.group(3).lower() == "pm" else 0)
    return f"{hour:02d}:{match.group(2) or '00'}"
