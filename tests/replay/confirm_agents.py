"""A travel agent ``tracedag confirm`` checks as ``module:function`` (traced by tracedag.instrument).

One turn ("I am <user>, find flights to <city>"): ``profile_lookup`` (optional: the agent carries on
without a profile), ``flight_search``, then the model step ``answer``, which fails when there are no
flights (its output can be replaced in a check: ``confirm_serve.replacement``). ``BROKEN`` names the tools that fail right now (an outage while the source conversations
were recorded); ``flight_search`` always fails for a city without an airport (``NO_AIRPORT``), so a
conversation to such a city fails whatever its profile lookup did: a failed profile lookup upstream
of it is a decoy, not its cause. ``travel_notified`` rates its answer (an evaluation on the model step) and
sends it with ``notify``: while ``notify`` is down the conversation fails whatever the answer was, so a
better answer shows only in the downstream step scores.
"""

from __future__ import annotations

import re
from typing import Any

from opentelemetry import trace

from tracedag import instrument as td
from tracedag.pipeline.replay.confirm_serve import replacement

BROKEN: set[str] = set()
NO_AIRPORT = {"Atlantis"}
MODEL = "travel-model"


class ToolDown(Exception):
    """A tool in an outage."""


def profile_lookup(user: str) -> dict[str, str]:
    """The user's profile."""
    if "profile_lookup" in BROKEN:
        raise ToolDown("profile service: HTTP 503")
    return {"user": user, "seat": "aisle"}


def flight_search(city: str) -> list[str]:
    """Flights to ``city``."""
    if "flight_search" in BROKEN:
        raise ToolDown("search service: HTTP 503")
    if city in NO_AIRPORT:
        raise ValueError(f"no airport in {city}")
    return [f"TD{len(city) * 101} to {city}"]


def _tool(name: str, fn: Any, **arguments: Any) -> Any:
    try:
        with td.tool(name, arguments=arguments) as step:
            result = step.run(fn, **arguments)
            step.set_result(result)
            return result
    except Exception:
        return None


class NoFlights(Exception):
    """The answer had no flight to offer."""


def _answer(flights: list[str] | None) -> str:
    with td.llm(MODEL, provider="test", input_messages=[str(flights)]) as step:
        step.set("gen_ai.response.finish_reasons", ["stop"])  # it calls no tool (no tool_call edge to one)
        served = replacement(f"chat {MODEL}")  # the step's name as stored: a check may replace its output
        if served is not None:
            text = served
        elif "answer" in BROKEN:
            raise ToolDown("model endpoint: HTTP 529 overloaded")
        elif not flights:
            raise NoFlights("no flights to offer")
        else:
            text = f"I found {flights[0]}."
        step.set_output(text, finish_reason="stop")
        return text


def travel(history: list[dict[str, Any]]) -> str:
    """Answer one travel request."""
    message = str(history[-1]["content"])
    user = (re.search(r"I am (\w+)", message) or [None, "guest"])[1]
    city = (re.search(r"to (\w+)", message) or [None, "nowhere"])[1]
    with td.agent("travel") as step:
        td.user_message(message)
        profile = _tool("profile_lookup", profile_lookup, user=user)
        flights = _tool("flight_search", flight_search, city=city)
        try:
            reply = _answer(flights)
        except (NoFlights, ToolDown):
            reply = "Sorry, I could not find a flight."
        step.set_output(reply + ("" if profile else " (no profile)"))
        return reply


def _plan(city: str) -> dict[str, str]:
    """The model writes the search call's arguments; confused ("plan" in ``BROKEN``) it names the field town."""
    with td.llm("planner-model", provider="test", input_messages=[city]) as step:
        arguments = {"town" if "plan" in BROKEN else "city": city}
        step.set_output(str(arguments), finish_reason="tool_calls")
        return arguments


def travel_planned(history: list[dict[str, Any]]) -> str:
    """``travel`` whose model plans the search call (its arguments may be made up: PARAMGEN)."""
    message = str(history[-1]["content"])
    city = (re.search(r"to (\w+)", message) or [None, "nowhere"])[1]
    with td.agent("travel") as step:
        td.user_message(message)
        flights = _tool("flight_search", flight_search, **_plan(city))
        try:
            reply = _answer(flights)
        except (NoFlights, ToolDown):
            reply = "Sorry, I could not find a flight."
        step.set_output(reply)
        return reply


def notify(user: str) -> str:
    """Send the user the answer (the notification service is down while ``notify`` is in ``BROKEN``)."""
    if "notify" in BROKEN:
        raise ToolDown("notification service: HTTP 503")
    return f"sent to {user}"


def _rated_answer(flights: list[str] | None) -> str:
    """The model's answer, rated by an evaluation on its span: helpfulness 5 with a flight to offer, 3 without."""
    with td.llm(MODEL, provider="test", input_messages=[str(flights)]) as step:
        text = f"I found {flights[0]}." if flights else "Sorry, no flight today."
        trace.get_current_span().add_event("gen_ai.evaluation.result", {
            "gen_ai.evaluation.name": "helpfulness", "gen_ai.evaluation.score.value": 5 if flights else 3})
        step.set_output(text, finish_reason="stop")
        return text


def travel_notified(history: list[dict[str, Any]]) -> str:
    """``travel`` whose answer is rated and then sent by ``notify``: a notification outage fails the
    conversation whatever the answer, so a better answer shows only in the downstream step scores."""
    message = str(history[-1]["content"])
    user = (re.search(r"I am (\w+)", message) or [None, "guest"])[1]
    city = (re.search(r"to (\w+)", message) or [None, "nowhere"])[1]
    with td.agent("travel") as step:
        td.user_message(message)
        profile = _tool("profile_lookup", profile_lookup, user=user)
        flights = _tool("flight_search", flight_search, city=city)
        reply = _rated_answer(flights)
        _tool("notify", notify, user=user)
        step.set_output(reply + ("" if profile else " (no profile)"))
        return reply
