"""An agent behind an OpenAI-compatible URL, in a process of its own: ``python -m tests.replay.remote_agent``.

``POST /v1/chat/completions`` runs :func:`tests.replay.sim_agents.wrong_branch` (``td.agent`` and
``td.node`` spans) on the request's messages and answers a ``chat.completion``. The process has its
own OpenTelemetry SDK TracerProvider (``td.configure``: BatchSpanProcessor, OTLP/HTTP exporter to
``--otlp``, service ``remote-agent``); each request's trace context and baggage are read from its
headers with the configured W3C propagators (``opentelemetry.propagate.extract``) and the request
is a SERVER span under them, so the agent's spans continue the caller's trace and carry its run
labels. ``--no-propagate`` ignores the headers (every request starts a trace of its own).
Prints its port, then serves until stdin closes; the spans are flushed before it exits.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace

from tests.replay.sim_agents import wrong_branch
from tracedag import instrument as td


def completion(text: str) -> dict[str, Any]:
    """A chat-completions response body with one choice."""
    return {"id": "chatcmpl-remote", "object": "chat.completion", "created": 1_700_000_000, "model": "remote",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


def handler(propagated: bool) -> type[BaseHTTPRequestHandler]:
    """The request handler: extract the caller's context, run the agent inside a SERVER span."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
            parent = propagate.extract(dict(self.headers.items())) if propagated else otel_context.Context()
            token = otel_context.attach(parent)
            try:
                with td.tracer().start_as_current_span("POST /v1/chat/completions", kind=trace.SpanKind.SERVER):
                    reply = wrong_branch(list(body.get("messages") or []))
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
    parser.add_argument("--no-propagate", action="store_true")
    args = parser.parse_args(argv)
    td.configure(args.otlp, service_name="remote-agent", schedule_delay_millis=50, set_global=True)
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler(not args.no_propagate))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(server.server_address[1], flush=True)
    sys.stdin.read()
    server.shutdown()
    td.shutdown()


if __name__ == "__main__":
    main()
