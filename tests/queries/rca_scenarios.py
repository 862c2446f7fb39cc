"""Conversations with faults injected where the truth is known, captured from REAL instrumentation.

Each conversation is driven by a small scripted agent loop: the official ``openai`` client
(traced by ``opentelemetry-instrumentation-openai-v2``) talks to a local fake chat-completions
server (``tests.realspans.fake_openai_server``) that replies from a script; the agent, its tools
and the conversation id are traced by ``tracedag.instrument`` (``agent``, ``tool``,
``conversation``). Tools fail by raising, the model fails by an HTTP 500, parallel branches are
cancelled by an ``asyncio.TaskGroup``. One user turn is one trace.

``SCENARIOS`` lists them by class; ``Scenario.truth`` is the root cause a person names for the
conversation: ``(turn_index, span name)``, or ``None`` when the conversation did not fail.
``capture(scenarios)`` returns the spans as one normalized ``spans`` table.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from tests.realspans import chat_completion, environ, fake_openai_server, to_table

MODEL = "gpt-4o-mini"
CHAT = f"chat {MODEL}"


class ToolFailure(Exception):
    """A fault injected into a tool."""


@dataclass
class Call:
    """A tool call the scripted model makes: tool name and arguments."""

    name: str
    args: dict[str, Any]


@dataclass
class Turn:
    """One user turn: the model's scripted replies, in order, and how the agent code behaves.

    ``replies``: per model call (a turn that raises must end its list there: one server serves
    every scenario in order), either a list of tool calls, a final text, or an HTTP status
    (an ``int``: the server answers that error). ``parallel``: the tool calls of one reply run
    concurrently in a TaskGroup (one failing cancels the others). ``raise_tool_errors``: a tool
    exception leaves the agent (else it is given to the model as the tool result). ``after``:
    agent code run after the model's final answer (it may raise, outside any tool span).
    """

    user: str
    replies: list[list[Call] | str | int]
    parallel: bool = False
    raise_tool_errors: bool = False
    after: Callable[[dict[str, Any]], None] | None = None


@dataclass
class Scenario:
    """A conversation with a known root cause."""

    name: str
    klass: str  # across_turns | fallback | cancelled | passing_step
    turns: list[Turn]
    truth: tuple[int, str] | None
    tools: dict[str, Callable[..., Any]] = field(default_factory=dict)
    note: str = ""

    @property
    def conversation_id(self) -> str:
        return f"conv-{self.name}"


# ---- tools (faults are raised) -----------------------------------------------------------------

def _ok(result: Any, delay: float = 0.0) -> Callable[..., Any]:
    def tool(**_: Any) -> Any:
        return result
    tool.delay = delay  # type: ignore[attr-defined]
    return tool


def _fail(message: str, delay: float = 0.0, exc: type[Exception] = ToolFailure) -> Callable[..., Any]:
    def tool(**_: Any) -> Any:
        raise exc(message)
    tool.delay = delay  # type: ignore[attr-defined]
    return tool


def _needs_state(key: str) -> Callable[[dict[str, Any]], None]:
    def after(state: dict[str, Any]) -> None:
        if key not in state:
            raise KeyError(f"{key} was never fetched")
    return after


# ---- the scripted agent ------------------------------------------------------------------------

def _reply_body(reply: list[Call] | str, n: int) -> dict[str, Any]:
    if isinstance(reply, str):
        return chat_completion(reply, tokens=(40 + n, 12))
    calls = [{"id": f"call_{n}_{i}", "name": c.name, "args": c.args} for i, c in enumerate(reply)]
    return chat_completion(None, calls, tokens=(40 + n, 15))


def _server_script(s: Scenario) -> list[tuple[int, dict[str, Any]]]:
    out: list[tuple[int, dict[str, Any]]] = []
    for t in s.turns:
        for r in t.replies:
            if isinstance(r, int):
                out.append((r, {"error": {"message": "upstream overloaded", "type": "server_error"}}))
            else:
                out.append((200, _reply_body(r, len(out))))
    return out


def _tool_json(result: Any) -> str:
    return result if isinstance(result, str) else json.dumps(result)


def _run_tool(td: Any, impl: Callable[..., Any], call: Any, state: dict[str, Any]) -> str:
    args = json.loads(call.function.arguments)
    with td.tool(call.function.name, call_id=call.id, arguments=args) as step:
        result = impl(**args)
        step.set_result(result)
    state[call.function.name] = result
    return _tool_json(result)


async def _run_tool_async(td: Any, impl: Callable[..., Any], call: Any, state: dict[str, Any]) -> str:
    args = json.loads(call.function.arguments)
    with td.tool(call.function.name, call_id=call.id, arguments=args) as step:
        await asyncio.sleep(getattr(impl, "delay", 0.0))
        result = impl(**args)
        step.set_result(result)
    state[call.function.name] = result
    return _tool_json(result)


async def _parallel(td: Any, s: Scenario, calls: Sequence[Any], state: dict[str, Any]) -> list[str]:
    tasks = []
    async with asyncio.TaskGroup() as group:
        for c in calls:
            tasks.append(group.create_task(_run_tool_async(td, s.tools[c.function.name], c, state)))
            await asyncio.sleep(0.002)  # start in order, a little apart
    return [t.result() for t in tasks]


def _tool_results(td: Any, s: Scenario, turn: Turn, calls: Sequence[Any], state: dict[str, Any]) -> list[str]:
    if turn.parallel:
        return asyncio.run(_parallel(td, s, calls, state))
    out = []
    for c in calls:
        try:
            out.append(_run_tool(td, s.tools[c.function.name], c, state))
        except Exception as e:  # the agent hands a tool's error to the model, unless told to raise
            if turn.raise_tool_errors:
                raise
            out.append(f"Error: {e}")
    return out


def _turn(td: Any, client: Any, s: Scenario, turn: Turn, history: list[dict[str, Any]],
          state: dict[str, Any]) -> None:
    history.append({"role": "user", "content": turn.user})
    with td.agent("assistant"):
        for _ in turn.replies:
            reply = client.chat.completions.create(model=MODEL, messages=history)
            message = reply.choices[0].message
            history.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                break
            results = _tool_results(td, s, turn, message.tool_calls, state)
            for c, r in zip(message.tool_calls, results, strict=True):
                history.append({"role": "tool", "tool_call_id": c.id, "content": r})
        if turn.after is not None:
            turn.after(state)


def _conversation(td: Any, client: Any, s: Scenario) -> None:
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are a shop assistant."}]
    state: dict[str, Any] = {}
    with td.conversation(s.conversation_id):
        for turn in s.turns:
            try:
                _turn(td, client, s, turn, history, state)
            except Exception:  # the turn failed; the user comes back with the next one
                history.append({"role": "assistant", "content": "Sorry, something went wrong."})


@contextmanager
def genai_content_env() -> Iterator[None]:
    """The GenAI instrumentations record messages on spans, with the latest attribute names."""
    with environ(OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="SPAN_ONLY",
                 OTEL_SEMCONV_STABILITY_OPT_IN="gen_ai_latest_experimental"):
        yield


def capture(scenarios: Sequence[Scenario]) -> pa.Table:
    """Run every scenario through the instrumented agent and return the normalized spans table."""
    import openai
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from tracedag import instrument as td

    exporter = InMemorySpanExporter()
    with genai_content_env():
        provider = td.configure(service_name="shop-agent", service_version="1.0", exporter=exporter,
                                set_global=False, schedule_delay_millis=50)
        instrumentor = OpenAIInstrumentor()
        instrumentor.instrument(tracer_provider=provider)
        try:
            with fake_openai_server([r for s in scenarios for r in _server_script(s)]) as srv:
                client = openai.OpenAI(base_url=srv.base_url, api_key="test-key", max_retries=0)
                for s in scenarios:
                    _conversation(td, client, s)
            td.force_flush()
        finally:
            instrumentor.uninstrument()
            td.shutdown()
    return to_table(exporter.get_finished_spans())


# ---- the scenarios -----------------------------------------------------------------------------

LOOKUP = Call("lookup_order", {"order_id": "A17"})
LOOKUP_DOWN = _fail("order service unavailable")
T1_FAILS = Turn("Where is my order A17?", [[LOOKUP], "I could not fetch your order right now."])
T1_OK = Turn("Where is my order A17?", [[LOOKUP], "Order A17 ships tomorrow."])
FIRST_TOOL = (1, "execute_tool lookup_order")

ACROSS_TURNS = [
    Scenario("x1-agent-raises", "across_turns",
             [T1_FAILS, Turn("Then cancel it.", ["Cancelling order A17."], after=_needs_state("lookup_order"))],
             FIRST_TOOL, {"lookup_order": LOOKUP_DOWN},
             "turn 2's agent code needs the order turn 1 never fetched (KeyError outside any tool span)"),
    Scenario("x2-tool-without-data", "across_turns",
             [T1_FAILS, Turn("Then cancel it.", [[Call("cancel_order", {"order_id": ""})]],
                             raise_tool_errors=True)],
             FIRST_TOOL, {"lookup_order": LOOKUP_DOWN, "cancel_order": _fail("order id is required")},
             "turn 2's tool is called without the id turn 1 never fetched"),
    Scenario("x3-three-turns", "across_turns",
             [T1_FAILS, Turn("Thanks. Any news?", ["No news today."]),
              Turn("Then cancel it.", ["Cancelling order A17."], after=_needs_state("lookup_order"))],
             FIRST_TOOL, {"lookup_order": LOOKUP_DOWN},
             "the turn between the failure and its effect passes"),
    Scenario("x4-model-outage-later", "across_turns",
             [T1_FAILS, Turn("Then cancel it.", [500])],
             (2, CHAT), {"lookup_order": LOOKUP_DOWN},
             "control: turn 2 fails on its own (the model provider answers 500)"),
    Scenario("x5-clean-then-tool-error", "across_turns",
             [T1_OK, Turn("Then cancel it.", [[Call("cancel_order", {"order_id": "A17"})]],
                          raise_tool_errors=True)],
             (2, "execute_tool cancel_order"),
             {"lookup_order": _ok({"order_id": "A17", "status": "packed"}),
              "cancel_order": _fail("order already shipped")},
             "control: turn 1 is clean, turn 2's tool fails"),
    Scenario("x6-independent-tool-error", "across_turns",
             [T1_FAILS, Turn("What's the weather in Paris?", [[Call("get_weather", {"city": "Paris"})]],
                             raise_tool_errors=True)],
             (2, "execute_tool get_weather"),
             {"lookup_order": LOOKUP_DOWN, "get_weather": _fail("weather backend crashed")},
             "control: turn 2's tool fails for a reason of its own (no signal tells it from x2)"),
]

def _flaky() -> Callable[..., Any]:
    calls = {"n": 0}

    def tool(**_: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise ToolFailure("rate limited, try again")
        return {"city": "Paris", "temp_c": 21}
    return tool


WEATHER = {"city": "Paris"}
FALLBACK = [
    Scenario("f1-cache-after-timeout", "fallback",
             [Turn("Weather in Paris?", [[Call("get_weather", WEATHER)], [Call("get_weather_cached", WEATHER)],
                                         "21C and sunny in Paris."])],
             None, {"get_weather": _fail("weather API timed out", exc=TimeoutError),
                    "get_weather_cached": _ok({"city": "Paris", "temp_c": 21})},
             "a cache serves the same request after a timeout"),
    Scenario("f2-backup-service", "fallback",
             [Turn("Flights CDG to JFK on May 3?",
                   [[Call("search_flights", {"origin": "CDG", "destination": "JFK", "date": "2026-05-03"})],
                    [Call("search_flights_backup", {"from": "CDG", "to": "JFK", "day": "2026-05-03"})],
                    "AF22 at 10:05."])],
             None, {"search_flights": _fail("HTTP 503 service unavailable"),
                    "search_flights_backup": _ok([{"flight": "AF22", "dep": "10:05"}])},
             "a backup service with other argument names, same values"),
    Scenario("f3-retry-same-tool", "fallback",
             [Turn("Weather in Paris?", [[Call("get_weather", WEATHER)], [Call("get_weather", WEATHER)],
                                         "21C and sunny."])],
             None, {"get_weather": _flaky()},
             "baseline: a retry of the same tool"),
    Scenario("f4-unrelated-later-tool", "fallback",
             [Turn("Weather in Paris?", [[Call("get_weather", WEATHER)], [Call("get_news", {"topic": "sports"})],
                                         "No weather, but here is the sports news."])],
             (1, "execute_tool get_weather"),
             {"get_weather": _fail("weather API timed out", exc=TimeoutError),
              "get_news": _ok({"headline": "Cup final tonight"})},
             "control: the later tool serves another purpose, nothing recovered the weather"),
    Scenario("f5-fallback-fails-too", "fallback",
             [Turn("Weather in Paris?", [[Call("get_weather", WEATHER)], [Call("get_weather_cached", WEATHER)],
                                         "Sorry, no weather data."])],
             (1, "execute_tool get_weather"),
             {"get_weather": _fail("weather API timed out", exc=TimeoutError),
              "get_weather_cached": _fail("cache miss")},
             "control: the fallback fails as well"),
]


def _branches(fail: str, names: Sequence[str], fail_delay: float = 0.03) -> dict[str, Callable[..., Any]]:
    return {n: (_fail(f"{n} backend crashed", delay=fail_delay) if n == fail else _ok({"ok": n}, delay=0.5))
            for n in names}


PARALLEL_3 = ["fetch_prices", "fetch_stock", "fetch_reviews"]
CANCELLED = [
    Scenario("c1-middle-branch-fails", "cancelled",
             [Turn("Compare this product.", [[Call(n, {"sku": "P1"}) for n in PARALLEL_3]], parallel=True)],
             (1, "execute_tool fetch_stock"), _branches("fetch_stock", PARALLEL_3),
             "the first branch started first and is cancelled"),
    Scenario("c2-last-branch-fails", "cancelled",
             [Turn("Compare this product.", [[Call(n, {"sku": "P2"}) for n in PARALLEL_3]], parallel=True)],
             (1, "execute_tool fetch_reviews"), _branches("fetch_reviews", PARALLEL_3),
             "two earlier branches are cancelled"),
    Scenario("c3-first-branch-fails", "cancelled",
             [Turn("Compare this product.", [[Call(n, {"sku": "P3"}) for n in PARALLEL_3]], parallel=True)],
             (1, "execute_tool fetch_prices"), _branches("fetch_prices", PARALLEL_3),
             "baseline: the failing branch is also the earliest"),
    Scenario("c4-five-branches", "cancelled",
             [Turn("Compare everything.", [[Call(f"fetch_{i}", {"sku": "P4"}) for i in range(5)]],
                   parallel=True)],
             (1, "execute_tool fetch_3"), _branches("fetch_3", [f"fetch_{i}" for i in range(5)], fail_delay=0.05),
             "four cancelled siblings, three of them earlier"),
]

PASSING_STEP = [
    Scenario("p1-independent-later-failure", "passing_step",
             [Turn("Weather in Paris and a taxi?", [[Call("get_weather", WEATHER)],
                                                    [Call("book_taxi", {"city": "Paris"})],
                                                    "Sorry, no weather and no taxi."])],
             (1, "execute_tool book_taxi"),
             {"get_weather": _fail("weather API timed out", exc=TimeoutError),
              "book_taxi": _fail("no drivers available")},
             "a failure, a passing model step, then an unrelated failure: the last one is its own cause"),
    Scenario("p2-made-up-id-after-failure", "passing_step",
             [Turn("Book the cheapest flight to JFK.",
                   [[Call("search_flights", {"destination": "JFK"})], [Call("book_flight", {"flight_id": "XX1"})],
                    "Sorry, booking failed."])],
             (1, "execute_tool search_flights"),
             {"search_flights": _fail("search backend down"), "book_flight": _fail("unknown flight XX1")},
             "the model passes but invents an id because the search failed: the search is the cause"),
]

SCENARIOS = [*ACROSS_TURNS, *FALLBACK, *CANCELLED, *PASSING_STEP]
