"""tracedag.testing: cases, run_step, evaluation events, and the judge against a local
OpenAI-compatible server (the real /chat/completions wire format)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tracedag import instrument as td
from tracedag.testing import CaseError, Judge, JudgeError, load_case, record_evaluation, run_step

CASE = {
    "format": "tracedag.case/v1",
    "source": {"trace_id": "ab" * 16, "span_id": "cd" * 8},
    "step": {"type": "tool", "name": "calendar", "input": {"day": "sat"}, "expected": {"output": [1], "status": "ok"}},
    "history": [{"kind": "message", "role": "user", "content": "book sat"},
                {"kind": "tool_call", "name": "calendar", "arguments": {"day": "fri"}, "result": []},
                {"kind": "tool_call", "name": "calendar", "arguments": {"day": "sat"}, "result": [3]}],
}


@pytest.fixture
def case(tmp_path):
    path = tmp_path / "case.json"
    path.write_text(json.dumps(CASE))
    return load_case(path)


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    td.configure(exporter=exporter, set_global=False)
    yield exporter
    td.shutdown()


def test_case_accessors(case, tmp_path):
    assert case.messages == [{"role": "user", "content": "book sat"}]
    assert case.tool_result("calendar") == [3]
    assert case.tool_result("calendar", {"day": "fri"}) == []
    with pytest.raises(KeyError):
        case.tool_result("book")
    assert case.step.input == {"day": "sat"} and case.step.expected_output == [1]
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "other"}')
    with pytest.raises(CaseError, match="not a tracedag case"):
        load_case(bad)


def test_run_step_sync_async_and_errors_in_a_labelled_span(case, spans):
    assert run_step(lambda c, extra: c.step.input["day"] + extra, case, "!").output == "sat!"

    async def async_step(c):
        return len(c.history)

    assert run_step(async_step, case).output == 3

    def broken(c):
        record_evaluation("format", 1.0, "fail", "bad json")
        raise ValueError("boom")

    failed = run_step(broken, case)
    assert not failed.ok and isinstance(failed.error, ValueError)
    td.force_flush()
    done = [s for s in spans.get_finished_spans() if s.name == "invoke_node calendar"]
    assert len(done) == 3
    assert done[0].attributes["tracedag.scenario_id"] == case.id
    assert done[0].attributes["tracedag.case.trace_id"] == "ab" * 16
    event = done[2].events[0]
    assert event.name == "gen_ai.evaluation.result"
    assert dict(event.attributes) == {"gen_ai.evaluation.name": "format", "gen_ai.evaluation.score.value": 1.0,
                                      "gen_ai.evaluation.score.label": "fail",
                                      "gen_ai.evaluation.explanation": "bad json"}


class _Chat(BaseHTTPRequestHandler):
    requests: list[dict] = []
    reply = '{"score": 2, "explanation": "misses the slot"}'

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Chat.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), **body})
        out = json.dumps({"id": "c1", "object": "chat.completion", "model": body["model"],
                          "choices": [{"index": 0, "finish_reason": "stop",
                                       "message": {"role": "assistant", "content": _Chat.reply}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


@pytest.fixture
def chat_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Chat)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Chat.requests = []
    yield f"http://127.0.0.1:{server.server_port}/v1"
    server.shutdown()


def test_judge_against_an_openai_compatible_endpoint(chat_server, spans):
    judge = Judge("judge-model", chat_server, "k-1", rubric="Proposes a free slot.", threshold=3)
    with td.node("test"):
        result = judge.grade("no slots today", context=[{"role": "user", "content": "book sat"}])
    assert (result.score, result.passed, result.explanation) == (2, False, "misses the slot")
    sent = _Chat.requests[0]
    assert sent["path"] == "/v1/chat/completions" and sent["auth"] == "Bearer k-1"
    assert sent["model"] == "judge-model" and sent["temperature"] == 0
    assert "Proposes a free slot." in sent["messages"][1]["content"]
    td.force_flush()
    (span,) = [s for s in spans.get_finished_spans() if s.name == "invoke_node test"]
    assert span.events[0].attributes["gen_ai.evaluation.score.value"] == 2.0
    _Chat.reply = "I cannot grade this."
    with pytest.raises(JudgeError, match="without a 1-5 score"):
        judge.grade("x", record=False)
    _Chat.reply = '{"score": 2, "explanation": "misses the slot"}'


def test_scripted_judge_and_environment(monkeypatch):
    judge = Judge.scripted([5, 1], threshold=4)
    assert [judge.grade("x", record=False).passed for _ in range(3)] == [True, False, True]
    monkeypatch.delenv("TRACEDAG_JUDGE_MODEL", raising=False)
    monkeypatch.delenv("TRACEDAG_JUDGE_SCRIPT", raising=False)
    assert Judge.from_env() is None
    monkeypatch.setenv("TRACEDAG_JUDGE_SCRIPT", "3")
    assert Judge.from_env().grade("x", record=False).score == 3
