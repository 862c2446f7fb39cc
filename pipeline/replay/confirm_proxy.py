"""``tracedag confirm --agent URL``: a local OpenAI-compatible proxy serves the root step's replacement.

An agent behind a URL runs its model calls and tools in its own process, where the check's
replacement and recording are not. So the check gives each run a base URL of its own on a proxy on
127.0.0.1 (``X-Tracedag-Model-Base-URL`` on every request of the run to the agent, beside the trace
context and the run labels as baggage), and the agent, for that request:

- sends its chat-completions calls to ``<base>/chat/completions``: the proxy forwards each to the real
  model (``--model-url``, the ``Authorization`` header passed on) and returns its answer, except at the
  root-cause call of a model-step check: the n-th call of the run whose ``model`` makes the root step's
  name (``chat <model>``, n its place among the source conversation's steps of that name), which gets
  the replacement (a passing run's output of the step, or the judge's correction) as a ``chat.completion``
  (streamed when asked);
- asks ``POST <base>/tracedag/tools`` ``{"name", "arguments"}`` before running a tool: ``{"served": true,
  "result"}`` (or ``"error_type"``, ``"error_message"`` for a recorded failure) is the recorded call or the
  root call's replacement, ``{"served": false}`` means run the tool. ``tracedag.instrument``'s
  ``ProxiedToolRecording(base)`` does this for ``td.tool`` steps, which mark a served call
  ``tracedag.tool.recorded = true`` as in-process recorded tools do;
- exports its spans, with the propagated trace context, to the collector ``--endpoint`` names.

A request without the header is ordinary traffic: the agent uses its own model. A run during which the
proxy could not reach the model is stopped (not counted: the agent failed for want of its model, which
says nothing about the root cause). After the runs the check waits for the agent's spans to reach the
store (``wait_for_agent``) before judging them.
"""

from __future__ import annotations

import json
import secrets
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from tracedag.instrument.recorded import PROXY_HEADER, ToolRecording, current
from tracedag.pipeline.replay.confirm import ConfirmError, PlannedCheck
from tracedag.pipeline.replay.targets import RUN_HEADERS, Outcome, RunInfo, Target

_JSON = "application/json"


@dataclass
class ProxiedRun:
    """What the proxy serves one run: its tool recording and, for a model-step check, the replaced call."""

    recording: ToolRecording | None
    step_name: str | None = None  # the root model step (``chat <model>``) whose output is replaced
    output: str | None = None
    ordinal: int = 1  # the root step's place among the run's calls with that name
    seen: int = 0
    unreachable: str | None = None  # why a forwarded call found no model: the run does not count


class ModelProxy:
    """The proxy on 127.0.0.1 (port 0): one base URL per run, forwarding to ``upstream``."""

    def __init__(self, upstream: str | None, timeout: float = 120.0) -> None:
        self.upstream = upstream.rstrip("/") if upstream else None
        self.timeout = timeout
        self._runs: dict[str, ProxiedRun] = {}
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="confirm-proxy", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        """The proxy's root URL."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()

    def open_run(self, run: ProxiedRun) -> tuple[str, str]:
        """Register a run; its token and the base URL the agent gets."""
        token = secrets.token_hex(8)
        with self._lock:
            self._runs[token] = run
        return token, f"{self.url}/runs/{token}/v1"

    def close_run(self, token: str) -> None:
        """Forget a run (its base URL answers 404 afterwards)."""
        with self._lock:
            self._runs.pop(token, None)

    def run_of(self, token: str) -> ProxiedRun | None:
        """The run a token names, if it is still open."""
        with self._lock:
            return self._runs.get(token)

    def chat(self, run: ProxiedRun, raw: bytes, authorization: str | None) -> tuple[int, str, bytes]:
        """A chat-completions request of ``run``: the replacement at the root call, else the real model's answer."""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return _error(400, "the request body is not JSON")
        if run.output is not None and run.step_name == f"chat {body.get('model')}":
            with self._lock:
                run.seen += 1
                hit = run.seen == run.ordinal
            if hit:
                return _replaced(str(body.get("model")), run.output, bool(body.get("stream")))
        return self._forward(run, raw, authorization)

    def _forward(self, run: ProxiedRun, raw: bytes, authorization: str | None) -> tuple[int, str, bytes]:
        if self.upstream is None:
            run.unreachable = "tracedag confirm's proxy has no model to forward to: give --model-url"
            return _error(502, run.unreachable)
        headers = {"Content-Type": _JSON, **({"Authorization": authorization} if authorization else {})}
        request = urllib.request.Request(f"{self.upstream}/chat/completions", data=raw, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return response.status, response.headers.get("Content-Type", _JSON), response.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers.get("Content-Type", _JSON), e.read()
        except (urllib.error.URLError, OSError) as e:
            run.unreachable = f"tracedag confirm's proxy cannot reach the model at {self.upstream}: {e}"
            return _error(502, run.unreachable)

    @staticmethod
    def tool(run: ProxiedRun, raw: bytes) -> tuple[int, str, bytes]:
        """A tool lookup of ``run``: the recorded call (or the replacement), or not served."""
        try:
            body = json.loads(raw or b"{}")
            name = str(body["name"])
        except (ValueError, KeyError, TypeError):
            return _error(400, 'expected {"name": ..., "arguments": ...}')
        call = run.recording.lookup(name, body.get("arguments")) if run.recording is not None else None
        if call is None:
            return 200, _JSON, json.dumps({"served": False}).encode()
        answer = {"served": True, "result": call.result, "error_type": call.error_type,
                  "error_message": call.error_message}
        return 200, _JSON, json.dumps(answer).encode()


def _error(status: int, message: str) -> tuple[int, str, bytes]:
    return status, _JSON, json.dumps({"error": {"message": message, "type": "tracedag_confirm"}}).encode()


def _replaced(model: str, output: str, stream: bool) -> tuple[int, str, bytes]:
    """The replacement as a ``chat.completion`` (or its stream of chunks)."""
    head = {"id": "chatcmpl-tracedag-confirm", "created": int(time.time()), "model": model}
    if not stream:
        doc = {**head, "object": "chat.completion",
               "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": output}}],
               "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}}
        return 200, _JSON, json.dumps(doc).encode()
    chunk = {**head, "object": "chat.completion.chunk"}
    events = [{**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": output}, "finish_reason": None}]},
              {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}]
    text = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    return 200, "text/event-stream", text.encode()


def _handler(proxy: ModelProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            parts = self.path.split("?", 1)[0].strip("/").split("/")
            run = proxy.run_of(parts[1]) if len(parts) >= 4 and parts[0] == "runs" and parts[2] == "v1" else None
            rest = "/".join(parts[3:])
            if run is None:
                answer = _error(404, f"no open tracedag confirm run at {self.path}")
            elif rest == "chat/completions":
                answer = proxy.chat(run, raw, self.headers.get("Authorization"))
            elif rest == "tracedag/tools":
                answer = proxy.tool(run, raw)
            else:
                answer = _error(404, f"tracedag confirm's proxy serves chat/completions and tracedag/tools, not {rest}")
            status, kind, payload = answer
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            return

    return Handler


class ProxiedTarget:
    """An endpoint target whose runs each get a base URL on the proxy (``RUN_HEADERS``)."""

    def __init__(self, inner: Target, proxy: ModelProxy, checks: Sequence[PlannedCheck]) -> None:
        self.inner = inner
        self.proxy = proxy
        self.checks = {c.cause.conversation_id: c for c in checks}
        self.name = inner.name
        self.service_name = inner.service_name
        self.service_version = inner.service_version

    def converse(self, turns: Sequence[str], run: RunInfo) -> Outcome:
        """The inner target's conversation, its requests carrying this run's proxy base URL."""
        proxied = self._proxied(run.conversation_id)
        token, base = self.proxy.open_run(proxied)
        reset = RUN_HEADERS.set({PROXY_HEADER: base})
        try:
            outcome = self.inner.converse(turns, run)
        finally:
            RUN_HEADERS.reset(reset)
            self.proxy.close_run(token)
        if proxied.unreachable is not None:  # the agent failed for want of its model: not a result
            return Outcome(outcome.replies, proxied.unreachable, stopped=True)
        return outcome

    def _proxied(self, conversation_id: str) -> ProxiedRun:
        check = self.checks.get(conversation_id)
        replacement = check.replacement if check is not None else None
        if check is None or replacement is None or replacement.output is None:
            return ProxiedRun(current())
        return ProxiedRun(current(), check.cause.root_step_name, replacement.output, replacement.ordinal)


def probe_agent(url: str, timeout: float = 5.0) -> None:
    """Raise ``ConfirmError`` when nothing accepts a connection at the agent's host and port."""
    parsed = urlparse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname or "", port), timeout=timeout):
            return
    except OSError as e:
        raise ConfirmError(f"--agent {url}: nothing answers at {parsed.hostname}:{port} ({e}); "
                           "is the agent running?") from e


AGENT_SPANS_SQL = """
select trace_id, span_id, parent_span_id, service_name = $local as local
from spans_all
where trace_id in (select trace_id from spans_all where conversation_id in (select unnest($ids)) and service_name = $local)
"""


def wait_for_agent(data: Path, turns: Mapping[str, int], local_service: str, timeout: float = 60.0,
                   poll: float = 0.25) -> bool:
    """Wait until every run's turns (``turns``: run id -> turns) are in ``data`` with the agent's part of
    each (``remote.settled``); False when ``timeout`` seconds passed first."""
    deadline = time.monotonic() + timeout
    while True:
        if _settled(data, turns, local_service):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll)


def _settled(data: Path, turns: Mapping[str, int], local_service: str) -> bool:
    from tracedag.pipeline.replay.remote import StoredSpan, settled
    from tracedag.pipeline.store.views import connect

    con = connect(data, threads=1, tables=["spans"])  # a poll reads spans_all only: not every view and macro
    try:
        rows = con.execute(AGENT_SPANS_SQL, {"ids": sorted(turns), "local": local_service}).fetchall()
    finally:
        con.close()
    traces: dict[str, list[tuple[StoredSpan, bool]]] = {}
    for trace_id, span_id, parent, local in rows:
        traces.setdefault(str(trace_id), []).append((StoredSpan(str(trace_id), str(span_id), parent or None, 0, None),
                                                     bool(local)))
    if len(traces) < sum(turns.values()):  # one trace per turn: the caller's agent step is its root
        return False
    return all(settled([s for s, _ in spans], {s.span_id for s, local in spans if local}) for spans in traces.values())
