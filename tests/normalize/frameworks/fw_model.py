"""A scripted OpenAI-compatible chat server on 127.0.0.1 that also streams (server-sent events).

``tests.realspans.fake_openai_server`` answers JSON only; some frameworks (Strands) always ask for a
stream (``"stream": true``). This server takes the same scripted (status, body) replies, in order,
and answers a streaming request with the reply cut into ``chat.completion.chunk`` events: the role,
the text, each tool call (id, name, arguments), then the finish reason with the usage, then
``[DONE]``, as the OpenAI API streams them.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.realspans import FakeOpenAI


def chunks(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The stream events of a chat-completions body with one choice."""
    choice = body["choices"][0]
    msg = choice["message"]
    base = {"id": body["id"], "object": "chat.completion.chunk", "created": body["created"], "model": body["model"]}

    def event(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}

    out = [event({"role": "assistant", "content": ""})]
    if msg.get("content"):
        out.append(event({"content": msg["content"]}))
    for i, call in enumerate(msg.get("tool_calls") or []):
        out.append(event({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                          "function": {"name": call["function"]["name"],
                                                       "arguments": call["function"]["arguments"]}}]}))
    out.append(event({}, choice["finish_reason"]))
    out.append({**base, "choices": [], "usage": body.get("usage")})
    return out


@contextmanager
def scripted_model(replies: Sequence[tuple[int, dict[str, Any]]]) -> Iterator[FakeOpenAI]:
    """Serve the scripted replies to POST .../chat/completions, streamed when the request asks."""
    state = FakeOpenAI(base_url="", requests=[], replies=list(replies))
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
            with lock:
                state.requests.append(request)
                status, reply = state.replies.pop(0) if state.replies else (500, {"error": {"message": "no reply"}})
            if not self.path.endswith("/chat/completions"):
                status, reply = 404, {"error": {"message": f"unknown path {self.path}"}}
            if status == 200 and request.get("stream"):
                self._stream(chunks(reply))
                return
            data = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _stream(self, events: list[dict[str, Any]]) -> None:
            data = b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)  # quick shutdown
    thread.start()
    state.base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
