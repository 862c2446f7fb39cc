"""A small scripted agent traced by the real traceloop-sdk decorators (run in its own virtualenv).

Not a test module: ``test_traceloop_sdk.py`` runs it with the python of a separate virtualenv
where traceloop-sdk is installed (it cannot be installed beside this project's OpenTelemetry
SDK). Usage: ``python traceloop_agent.py OTLP_HTTP_ENDPOINT OPENAI_BASE_URL``.

What it does, and so what the spans must say:

- ``trip_planner`` (@workflow) sets the association properties ``chat_id=chat-42`` and
  ``user_id=u-7`` (the keys of traceloop's own documentation example), then calls
- ``travel_agent`` (@agent), which calls
  - ``plan_route`` (@task, named after the function) once,
  - ``lookup_weather`` (@tool, given name) twice, in a loop over two days,
  - ``book_taxi`` (@tool, named after the function) which raises ``TimeoutError`` (the agent
    catches it and goes on),
  - ``write_summary`` (@task, given name) which makes one chat completion through the ``openai``
    client (traced by traceloop's openai instrumentation) against a scripted local server.

Spans go to the OTLP/HTTP endpoint through traceloop's own exporter (``Traceloop.init``,
``disable_batch=True``); on success the script prints the workflow's result as JSON.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from traceloop.sdk import Traceloop
from traceloop.sdk.decorators import agent, task, tool, workflow
from traceloop.sdk.instruments import Instruments

ASSOCIATION = {"chat_id": "chat-42", "user_id": "u-7"}
RUN_LABELS = {"tracedag.run_id": "run-tl-1", "tracedag.scenario_id": "trip", "service.version": "2.0.0"}
OPENAI: dict[str, Any] = {}


@tool(name="lookup_weather")
def weather_tool(city: str, day: int) -> str:
    """Return the (fixed) weather of ``city`` on ``day``."""
    return f"{city} day {day}: 21C and sunny"


@tool()
def book_taxi(city: str) -> str:
    """Always fail: the taxi service times out."""
    raise TimeoutError(f"taxi service in {city} timed out")


@task()
def plan_route(city: str) -> dict[str, Any]:
    """Return a two-day route through ``city``."""
    return {"city": city, "days": 2}


@task(name="write_summary")
def summarize(notes: list[str]) -> str:
    """Ask the chat model for a summary of ``notes``."""
    client = OPENAI["client"]
    reply = client.chat.completions.create(
        model="gpt-4o-mini",
        messages=[
            {"role": "system", "content": "You summarize travel notes."},
            {"role": "user", "content": "Summarize: " + "; ".join(notes)},
        ],
    )
    return str(reply.choices[0].message.content)


@agent(name="travel_agent")
def travel_agent(city: str) -> str:
    """Plan, look the weather up for each day, try a taxi, summarize."""
    route = plan_route(city)
    notes = [weather_tool(city, day) for day in range(1, route["days"] + 1)]
    try:
        notes.append(book_taxi(city))
    except TimeoutError:
        notes.append("no taxi")
    return summarize(notes)


@workflow(name="trip_planner")
def trip_planner(city: str) -> dict[str, str]:
    """The whole run: one conversation with the travel agent."""
    Traceloop.set_association_properties(ASSOCIATION)
    return {"city": city, "summary": travel_agent(city)}


def main(endpoint: str, openai_base_url: str) -> None:
    """Initialize traceloop towards ``endpoint``, run the workflow once, print its result."""
    import openai

    Traceloop.init(
        app_name="trip-agent",
        api_endpoint=endpoint,
        disable_batch=True,
        telemetry_enabled=False,
        resource_attributes=dict(RUN_LABELS),
        instruments={Instruments.OPENAI},
    )
    OPENAI["client"] = openai.OpenAI(base_url=openai_base_url, api_key="test-key", max_retries=0)
    result = trip_planner("Lyon")
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
