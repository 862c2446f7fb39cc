"""The tennis-court booking agent, instrumented with ``tracedag.instrument``.

One conversation is one trace: ``invoke_agent court_booking.<variant>`` with one ``invoke_node``
span per node visited, each holding its ``chat`` and ``execute_tool`` spans. A node that raises
ends in ERROR; the agent carries on with what it has (an empty slot list after a calendar fault),
so the failure propagates: no slot to propose, a booking rejected, a conversation that failed.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tracedag import instrument as td
from tracedag.pipeline.demo.agent import booking_graph as graph
from tracedag.pipeline.demo.agent.booking_tools import BookingSystem, Calendar, club_info
from tracedag.pipeline.demo.agent.fake_llm import MODEL, PROVIDER, ScriptedLLM
from tracedag.pipeline.demo.agent.tweaks import REPHRASED, Tweaks

logger = logging.getLogger(__name__)

MAX_STEPS = 14
MAX_ASKS = 3


class NoSlotToPropose(Exception):
    """propose_slot had no free slot to offer."""


class ConversationFailed(Exception):
    """The conversation ended without reaching the user's goal because a step failed."""


@dataclass
class State:
    """What the agent knows in one conversation."""

    user_turns: list[str]
    intent: str | None = None
    topic: str | None = None
    date: str | None = None
    time: str | None = None
    asks: int = 0
    slots: list[dict[str, Any]] | None = None
    proposed: dict[str, Any] | None = None
    accepted: bool | None = None
    booking_id: str | None = None
    booking_tried: bool = False
    answered: bool = False
    path: list[str] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)
    failed_nodes: list[str] = field(default_factory=list)
    failed_visits: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def unrecovered(self) -> list[str]:
        """Failed nodes that no later visit of the same node made good."""
        failed = set(self.failed_visits)
        return [
            self.path[i] for i in self.failed_visits
            if not any(self.path[j] == self.path[i] and j not in failed for j in range(i + 1, len(self.path)))
        ]

    def next_user_turn(self) -> str:
        """The user's next message ('' once the script is exhausted)."""
        message = self.user_turns.pop(0) if self.user_turns else ""
        td.user_message(message)  # on the node reading it: `tracedag replay` reads the turns back
        return message


@dataclass(frozen=True)
class ConversationResult:
    """The outcome of one conversation."""

    path: tuple[str, ...]
    replies: tuple[str, ...]
    failed_nodes: tuple[str, ...]
    errors: tuple[str, ...]
    booking_id: str | None
    unrecovered: tuple[str, ...] = ()

    @property
    def failed(self) -> bool:
        """True when a node failed and no later visit of it succeeded (the conversation failed)."""
        return bool(self.unrecovered)


@dataclass
class BookingAgent:
    """The booking agent of one variant, with its own seeded model and tools."""

    variant: graph.Variant
    llm: ScriptedLLM
    calendar: Calendar
    bookings: BookingSystem
    tweaks: Tweaks = field(default_factory=Tweaks)

    @classmethod
    def create(
        cls,
        variant: graph.Variant,
        rng: random.Random,
        fault_rng: random.Random,
        *,
        fault_rate: float = 0.25,
        noise: float = 0.04,
        latency_scale: float = 1.0,
        tweaks: Tweaks | None = None,
    ) -> BookingAgent:
        """Build an agent whose model and tools draw from the given seeded generators.

        ``tweaks``: default-off changes that simulate an update of the agent (``tweaks.Tweaks``).
        """
        tweaks = tweaks or Tweaks()
        llm = ScriptedLLM(rng, noise=noise, latency_scale=latency_scale,
                          templates=REPHRASED if tweaks.rephrase else None)
        calendar = Calendar(fault_rng, fault_rate=fault_rate, latency_scale=latency_scale * tweaks.calendar_latency)
        return cls(variant, llm, calendar, BookingSystem(rng, latency_scale=latency_scale), tweaks)

    def run(self, user_turns: Sequence[str]) -> ConversationResult:
        """Hold one conversation driven by the scripted ``user_turns``; one trace."""
        state = State(list(user_turns))
        try:
            with td.agent(graph.agent_name(self.variant), version="1.0") as step:
                self._walk(state)
                if state.unrecovered():
                    raise ConversationFailed(f"failed steps: {', '.join(state.unrecovered())}")
                step.set_output(state.replies[-1] if state.replies else "", finish_reason="stop")
        except ConversationFailed:
            logger.debug("conversation failed at %s", state.failed_nodes)
        return ConversationResult(
            tuple(state.path), tuple(state.replies), tuple(state.failed_nodes), tuple(state.errors),
            state.booking_id, tuple(state.unrecovered()),
        )

    def _walk(self, state: State) -> None:
        current = graph.START
        for _ in range(MAX_STEPS):
            state.path.append(current)
            nxt = self._run_node(current, state)
            if current in graph.TERMINALS:
                return
            current = nxt
        state.path.append("finalize")
        self._run_node("finalize", state)

    def _run_node(self, name: str, state: State) -> str:
        """Run one node; returns the next node its model chose. A failing node is recorded, not fatal."""
        handler = _HANDLERS[name]
        try:
            with td.node(name):
                return handler(self, state)
        except Exception as exc:
            logger.debug("node %s failed", name, exc_info=True)
            state.failed_nodes.append(name)
            state.failed_visits.append(len(state.path) - 1)
            state.errors.append(type(exc).__name__)
            return self._route(state, name)

    def _route(self, state: State, node: str) -> str:
        nxt = str(self.llm.choose(intended_next(state), graph.allowed(self.variant, node)))
        skip = self.tweaks.skip_availability_rate
        if skip and nxt == "check_availability" and self.llm.rng.random() < skip:
            return "propose_slot"  # tweak: the router skips the calendar search
        return nxt

    def _say(self, state: State, template: str, prompt: Sequence[str], **facts: object) -> str:
        """One model call: reply from ``template`` and record it on a ``chat`` span."""
        with td.llm(MODEL, provider=PROVIDER, input_messages=list(prompt)) as step:
            done = self.llm.complete(prompt, template, **facts)
            step.set_output(done.text, finish_reason=done.finish_reason)
            step.set_usage(done.input_tokens, done.output_tokens)
        text = str(done.text)
        state.replies.append(text)
        return text

    def _tool(self, name: str, arguments: dict[str, Any], call: Callable[..., Any]) -> Any:
        with td.tool(name, call_id=self.llm.tool_call_id(), arguments=arguments) as step:
            result = step.run(call, **arguments)  # a replay with --tools recorded serves the recorded result
            step.set_result(result)
            return result

    # -- nodes ---------------------------------------------------------------------------------

    def router(self, state: State) -> str:
        """Read the first message and pick the topic."""
        message = state.next_user_turn()
        seen = self.llm.understand(message)
        state.intent, state.topic = seen.intent or "book", seen.topic
        state.date, state.time = seen.date, seen.time
        self._say(state, "router_info" if state.intent == "info" else "router_book", [message])
        return self._route(state, "router")

    def club_info(self, state: State) -> str:
        """Answer a question about the club."""
        fact = self._tool("club_info", {"topic": state.topic or "hours"}, club_info)
        self._say(state, "club_info", [state.topic or "hours"], answer=fact["answer"])
        state.answered = True
        return self._route(state, "club_info")

    def ask_details(self, state: State) -> str:
        """Read the user's date and time; re-ask while one is missing."""
        message = state.next_user_turn()
        seen = self.llm.understand(message)
        state.date, state.time = seen.date or state.date, seen.time or state.time
        state.asks += 1
        complete = state.date is not None and state.time is not None
        self._say(state, "details_ok" if complete else "ask_again", [message], date=state.date, time=state.time)
        return self._route(state, "ask_details")

    def check_availability(self, state: State) -> str:
        """Search the calendar for free courts."""
        state.slots = []
        args = {"date": state.date, "time_of_day": state.time}
        drop = self.tweaks.drop_time_rate
        if drop and self.llm.rng.random() < drop:
            del args["time_of_day"]  # tweak: the prompt no longer makes the model pass the time
        state.slots = self._tool("calendar_search", args, self.calendar.search)
        self._say(state, "availability", [f"{len(state.slots)} slots"], n=len(state.slots))
        return self._route(state, "check_availability")

    def propose_slot(self, state: State) -> str:
        """Propose the first free slot and read the user's answer."""
        slot = state.slots[0] if state.slots else None
        facts = slot or {}
        self._say(state, "propose" if slot else "", [str(facts)], **facts)
        seen = self.llm.understand(state.next_user_turn())
        state.accepted = seen.accepts
        state.proposed = slot
        if slot is None:
            raise NoSlotToPropose("no free slot to propose: the availability list is empty")
        self._say(state, "accepted" if seen.accepts else "declined", [str(seen.accepts)], **facts)
        return self._route(state, "propose_slot")

    def book_court(self, state: State) -> str:
        """Book the proposed slot."""
        state.booking_tried = True
        slot_id = (state.proposed or {}).get("slot_id")
        booking = self._tool("create_booking", {"slot_id": slot_id, "name": "Alex"}, self.bookings.create)
        state.booking_id = booking["booking_id"]
        self._say(state, "booked", [slot_id or ""], booking_id=state.booking_id)
        return self._route(state, "book_court")

    def finalize(self, state: State) -> str:
        """Close the conversation with a reply that sums it up (so replies can be compared)."""
        self._say(state, "finalize", state.replies[-1:], summary=summary(state))
        return "finalize"


def summary(state: State) -> str:
    """What the conversation came to, in one sentence: the final reply carries it (EDGE's response
    consistency compares final replies; a bare goodbye would make every run agree)."""
    slot = state.proposed or {}
    if state.booking_id:
        return f"You are booked on court {slot.get('court')} on {state.date} at {state.time}."
    if state.intent == "info":
        return f"You asked about our {state.topic or 'hours'}." if state.answered else "I could not answer your question."
    if state.booking_tried or state.accepted:
        return f"I could not book a court on {state.date} at {state.time}."
    if state.accepted is False:
        return "You did not want the court I proposed, so nothing is booked."
    return f"Nothing is booked for {state.date or 'any day'} at {state.time or 'any time'}."


def intended_next(state: State) -> str:
    """The node a well-behaved agent would go to next, from what it knows."""
    if state.intent == "info":
        return "finalize" if state.answered else "club_info"
    if state.date is None or state.time is None:
        return "ask_details" if state.asks < MAX_ASKS else "finalize"
    if state.slots is None:
        return "check_availability"
    if state.proposed is None and state.accepted is None:
        return "propose_slot"
    if state.accepted and not state.booking_tried:
        return "book_court"
    return "finalize"


_HANDLERS: dict[str, Callable[[BookingAgent, State], str]] = {
    "router": BookingAgent.router,
    "club_info": BookingAgent.club_info,
    "ask_details": BookingAgent.ask_details,
    "check_availability": BookingAgent.check_availability,
    "propose_slot": BookingAgent.propose_slot,
    "book_court": BookingAgent.book_court,
    "finalize": BookingAgent.finalize,
}
