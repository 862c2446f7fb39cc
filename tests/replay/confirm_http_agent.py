"""The travel agent of ``confirm_agents`` behind an OpenAI-compatible URL, in a process of its own:
``python -m tests.replay.confirm_http_agent --otlp URL --model-url URL``.

``POST /v1/chat/completions`` answers the last user message ("I am <user>, find flights to <city>"):
``profile_lookup`` and ``flight_search`` (``td.tool`` steps), then the model step ``chat travel-model``,
which asks a real model through the real ``openai`` client and fails when the model is down or answers
``NO_FLIGHTS``. The process has its own OpenTelemetry SDK (``td.configure``: OTLP/HTTP to ``--otlp``);
each request's trace context and baggage are extracted, so its spans continue the caller's trace and
carry its run labels. It follows ``tracedag confirm``'s contract: a request carrying
``X-Tracedag-Model-Base-URL`` sends its model calls there and asks that proxy for its tools
(``ProxiedToolRecording``); any other request uses ``--model-url`` and runs its tools. The run label
``broken`` (baggage ``tracedag.broken``, comma-separated tool names) is the outage the recorded
conversations met. Prints its port, then serves until stdin closes; the spans are flushed before it exits.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import openai
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace

from tests.replay.confirm_agents import MODEL, NO_AIRPORT
from tests.replay.remote_agent import completion
from tracedag import instrument as td
from tracedag.instrument.labels import baggage_labels
from tracedag.instrument.recorded import PROXY_HEADER, ProxiedToolRecording, recorded_tools


class ToolDown(Exception):
    """A tool in an outage."""


class NoFlights(Exception):
    """The model had no flight to offer."""


def _tool(name: str, fn: Callable[..., Any], broken: set[str], **arguments: Any) -> Any:
    def run(**kw: Any) -> Any:
        if name in broken:
            raise ToolDown(f"{name}: HTTP 503")
        return fn(**kw)

    try:
        with td.tool(name, arguments=arguments) as step:
            result = step.run(run, **arguments)
            step.set_result(result)
            return result
    except Exception:
        return None


def _flights(city: str) -> list[str]:
    if city in NO_AIRPORT:
        raise ValueError(f"no airport in {city}")
    return [f"TD{len(city) * 101} to {city}"]


def _answer(client: openai.OpenAI, flights: list[str] | None) -> str:
    prompt = f"Offer one of these flights: {json.dumps(flights)}"
    with td.llm(MODEL, provider="test", input_messages=[prompt]) as step:
        reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}])
        text = reply.choices[0].message.content or ""
        if text == "NO_FLIGHTS":
            raise NoFlights("no flights to offer")
        step.set_output(text, finish_reason="stop")
        return text


def travel(message: str, client: openai.OpenAI, broken: set[str]) -> str:
    """One travel request, as ``confirm_agents.travel`` answers it, the model behind ``client``."""
    user = (re.search(r"I am (\w+)", message) or [None, "guest"])[1]
    city = (re.search(r"to (\w+)", message) or [None, "nowhere"])[1]
    with td.agent("travel") as step:  # the user's message is on the caller's step (the turn it sent)
        profile = _tool("profile_lookup", lambda user: {"user": user, "seat": "aisle"}, broken, user=user)
        flights = _tool("flight_search", _flights, broken, city=city)
        try:
            reply = _answer(client, flights)
        except (NoFlights, openai.APIError):
            reply = "Sorry, I could not find a flight."
        step.set_output(reply + ("" if profile else " (no profile)"))
        return reply


def handler(model_url: str) -> type[BaseHTTPRequestHandler]:
    """Serve one turn per request, under the caller's trace context and baggage."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
            token = otel_context.attach(propagate.extract(dict(self.headers.items())))
            proxy = self.headers.get(PROXY_HEADER)
            client = openai.OpenAI(base_url=proxy or model_url, api_key="agent-key", max_retries=0)
            broken = set(filter(None, baggage_labels().get("tracedag.broken", "").split(",")))
            try:
                with td.tracer().start_as_current_span("POST /v1/chat/completions", kind=trace.SpanKind.SERVER):
                    message = str((body.get("messages") or [{}])[-1].get("content", ""))
                    if proxy:
                        with recorded_tools(ProxiedToolRecording(proxy)):
                            reply = travel(message, client, broken)
                    else:
                        reply = travel(message, client, broken)
            finally:
                otel_context.detach(token)
            data = json.dumps(completion(reply)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            return

    return Handler


def main(argv: list[str] | None = None) -> None:
    """Serve until stdin closes."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--otlp", required=True, help="OTLP/HTTP endpoint of a tracedag collector")
    parser.add_argument("--model-url", required=True, help="the agent's own model (OpenAI-compatible base URL)")
    args = parser.parse_args(argv)
    td.configure(args.otlp, service_name="travel-http-agent", schedule_delay_millis=50, set_global=True)
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler(args.model_url))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(server.server_address[1], flush=True)
    sys.stdin.read()
    server.shutdown()
    td.shutdown()


if __name__ == "__main__":
    main()
