"""The judge against a local chat-completions server (stdlib http.server on 127.0.0.1, port 0),
through the real ``openai`` client: answers, malformed output, 429 + Retry-After, 5xx, timeouts,
cache hits, bounded concurrency, cost accounting and the same-family warning."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.score.score_support import span
from tracedag.pipeline.score import JudgeConfig, score_store
from tracedag.pipeline.score.judge.client import retry_after_seconds
from tracedag.pipeline.score.judge.config import model_family, parse_verdict
from tracedag.pipeline.store.views import connect

T = "b" * 32
SUNNY = "It is a sunny 24 degrees in Paris."


def verdict(score: int, l3: str | None = None, explanation: str = "checked against the inputs") -> str:
    return json.dumps({"score": score, "taxonomy_l3": l3, "explanation": explanation})


def _output(body: dict) -> str:
    return body["messages"][1]["content"].rsplit("\n\nOUTPUT:\n", 1)[-1]


def grade_by_content(body: dict) -> str:
    """The fake judge: fails the sunny answer as unfaithful, passes everything else."""
    if SUNNY in _output(body):
        return verdict(1, "unfaithful_output", "contradicts the tool result of 12 C")
    return verdict(5)


class FakeJudge:
    """A chat-completions server: scripted replies first, then ``default(body)`` answers."""

    def __init__(self, default: Callable[[dict], str] = grade_by_content) -> None:
        self.default = default
        self.script: list[tuple[int, dict, str | None, float]] = []  # status, headers, content, delay
        self.requests: list[tuple[float, dict]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()

    def answer(self, body: dict) -> tuple[int, dict, bytes, float]:
        with self.lock:
            self.requests.append((time.monotonic(), body))
            status, headers, content, delay = self.script.pop(0) if self.script else (200, {}, None, 0.0)
        if status != 200:
            message = content or "scripted"
            return status, headers, json.dumps({"error": {"message": message, "type": "x"}}).encode(), delay
        text = content if content is not None else self.default(body)
        if text.startswith("RAW:"):  # a broken HTTP body, not a chat completion
            return 200, headers, text[4:].encode(), delay
        doc = {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": body["model"],
               "choices": [{"index": 0, "finish_reason": "stop",
                            "message": {"role": "assistant", "content": text}}],
               "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}}
        return 200, headers, json.dumps(doc).encode(), delay


@contextmanager
def serve(fake: FakeJudge):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with fake.lock:
                fake.in_flight += 1
                fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
            try:
                status, headers, payload, delay = fake.answer(body)
                time.sleep(delay)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (timeout test)
            finally:
                with fake.lock:
                    fake.in_flight -= 1

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)  # quick shutdown
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


STEPS = [
    span(T, "root", None, step_type="agent", step_name="weather_agent", input_text="Weather in Paris?",
         output_text="Done.", start_time_unix_nano=1, end_time_unix_nano=9_000),
    span(T, "tool1", "root", step_type="tool", step_name="get_weather", tool_name="get_weather",
         input_text='{"city": "Paris"}', output_text='{"temp_c": 12}', start_time_unix_nano=10,
         end_time_unix_nano=100, status_code=2, error_type="ValueError"),
    span(T, "llm1", "root", step_type="llm", step_name="chat", model="gpt-4o", input_text="Weather in Paris?",
         output_text=SUNNY, start_time_unix_nano=200, end_time_unix_nano=300),
    span(T, "emb", "root", step_type="embedding", step_name="embed", start_time_unix_nano=400,
         end_time_unix_nano=500),
]
EDGES = [("tool1", "llm1"), ("llm1", "root")]


def _store(builder, build_id="b1", built=10):
    builder.spans(STEPS)
    builder.build(STEPS, build_id=build_id, built=built, edges=EDGES)


def _cfg(url, **kw):
    base = {"model": "judge-x-1", "base_url": url, "api_key": "k", "concurrency": 2, "timeout_s": 5.0,
            "max_backoff_s": 2.0}
    base.update(kw)
    return JudgeConfig(**base)


def _judge_rows(data):
    con = connect(data, shared_macros=False)  # views only, no query macro
    rows = con.execute("select span_id, metric, score, judge_model, rubric_version, taxonomy_l1, taxonomy_l3, "
                       "explanation, build_id from step_scores where source = 'judge' order by span_id").fetchall()
    con.close()
    return {r[0]: r[1:] for r in rows}


def test_judge_grades_with_rubrics_and_upstream_outputs(builder):
    _store(builder)
    fake = FakeJudge()
    with serve(fake) as url:
        stats = score_store(builder.data, judge=_cfg(url, price_in=1.0, price_out=2.0))
    rows = _judge_rows(builder.data)
    # agent, tool and llm have rubrics; the embedding step has none
    assert set(rows) == {"root", "tool1", "llm1"}
    assert rows["llm1"][:6] == ("response_quality", 1.0, "judge-x-1", "llm.response_quality@1.0.0",
                                "generation", "unfaithful_output")
    assert rows["tool1"][:2] == ("tool_call_quality", 5.0) and rows["tool1"][5] is None
    assert rows["root"][0] == "task_progress" and rows["root"][7] == "b1"
    bodies = [b for _, b in fake.requests]
    assert len(bodies) == 3
    assert all(b["temperature"] == 0 and b["model"] == "judge-x-1" for b in bodies)
    assert all(b["response_format"] == {"type": "json_object"} for b in bodies)
    llm_user = next(b["messages"][1]["content"] for b in bodies if SUNNY in _output(b))
    # the judge sees the upstream tool output, never the upstream (rule) scores
    assert '{"temp_c": 12}' in llm_user and "tool get_weather" in llm_user
    assert "score" not in llm_user.lower() and "tool_status_error" not in llm_user
    j = stats.judge
    assert (j.calls, j.cache_hits, j.input_tokens, j.output_tokens, j.errors) == (3, 0, 300, 60, 0)
    assert j.cost_usd == pytest.approx((300 * 1.0 + 60 * 2.0) / 1e6)


def test_rerun_is_free_and_new_build_hits_the_cache(builder):
    _store(builder)
    fake = FakeJudge()
    with serve(fake) as url:
        score_store(builder.data, judge=_cfg(url))
        assert len(fake.requests) == 3
        again = score_store(builder.data, judge=_cfg(url))  # nothing new to judge
        assert again.judge.calls == 0 and len(fake.requests) == 3
        builder.build(STEPS, build_id="b2", built=20, edges=EDGES)  # same steps, rebuilt
        third = score_store(builder.data, judge=_cfg(url))
    assert len(fake.requests) == 3, "cache hits must not reach the server"
    assert (third.judge.cache_hits, third.judge.calls, third.judge.input_tokens) == (3, 0, 0)
    rows = _judge_rows(builder.data)
    assert {r[7] for r in rows.values()} == {"b2"} and rows["llm1"][1] == 1.0


def test_malformed_answer_is_reasked_then_recorded_as_error(builder):
    _store(builder)
    fake = FakeJudge(default=lambda body: "I think it is fine.")
    with serve(fake) as url:
        stats = score_store(builder.data, judge=_cfg(url, parse_retries=1, concurrency=1))
        assert stats.judge.errors == 3 and stats.judge.malformed == 6 and stats.judge.judged == 0
        assert _judge_rows(builder.data) == {}
        # the re-ask shows the model its invalid answer and the reason
        second = fake.requests[1][1]["messages"]
        assert second[2] == {"role": "assistant", "content": "I think it is fine."}
        assert "invalid" in second[3]["content"]
        # errors are not cached: a later run with a working judge grades those steps
        fake.default = grade_by_content
        fake.script = [(200, {}, '{"score": 9, "explanation": "x"}', 0.0)]  # out of range, then valid
        later = score_store(builder.data, judge=_cfg(url, concurrency=1))
    assert later.judge.judged == 3 and later.judge.malformed == 1 and later.judge.errors == 0
    assert set(_judge_rows(builder.data)) == {"root", "tool1", "llm1"}


def test_429_with_retry_after_is_honoured(builder):
    spans = [STEPS[2]]
    builder.spans(spans)
    builder.build(spans)
    fake = FakeJudge()
    fake.script = [(429, {"Retry-After": "1"}, None, 0.0)]
    with serve(fake) as url:
        stats = score_store(builder.data, judge=_cfg(url))
    (t0, _), (t1, _) = fake.requests
    assert t1 - t0 >= 0.95
    assert stats.judge.retries == 1 and stats.judge.judged == 1


def test_5xx_and_timeout_are_retried(builder):
    spans = [STEPS[2]]
    builder.spans(spans)
    builder.build(spans)
    fake = FakeJudge()
    fake.script = [(503, {}, None, 0.0), (200, {}, verdict(4), 1.5)]  # then a request that times out
    with serve(fake) as url:
        stats = score_store(builder.data, judge=_cfg(url, timeout_s=0.5))
    assert len(fake.requests) == 3 and stats.judge.retries == 2
    assert _judge_rows(builder.data)["llm1"][1] == 1.0  # third answer came from grade_by_content


def test_timeouts_exhausting_retries_are_a_recorded_error(builder, caplog):
    spans = [STEPS[2]]
    builder.spans(spans)
    builder.build(spans)
    fake = FakeJudge()
    fake.script = [(200, {}, verdict(5), 1.0)] * 2
    with serve(fake) as url, caplog.at_level(logging.WARNING):
        stats = score_store(builder.data, judge=_cfg(url, timeout_s=0.3, max_retries=1))
    assert stats.judge.errors == 1 and stats.judge.judged == 0
    assert "APITimeoutError" in stats.judge.error_samples[0]
    assert any("judge error" in r.message for r in caplog.records)


def test_concurrency_is_bounded(builder):
    spans = [span(T, f"l{i}", None, step_type="llm", step_name="chat", output_text=f"answer {i}")
             for i in range(6)]
    builder.spans(spans)
    builder.build(spans)
    fake = FakeJudge()
    fake.script = [(200, {}, verdict(5), 0.3)] * 6
    with serve(fake) as url:
        stats = score_store(builder.data, judge=_cfg(url, concurrency=2))
    assert stats.judge.judged == 6 and fake.max_in_flight == 2


def test_same_family_warning(builder, caplog):
    _store(builder)
    with serve(FakeJudge()) as url, caplog.at_level(logging.WARNING):
        stats = score_store(builder.data, judge=_cfg(url, model="gpt-4o-mini"))
    assert stats.judge.same_family_models == ["gpt-4o"]
    assert any("same model family" in r.message for r in caplog.records)


def test_max_steps_leaves_the_rest_for_the_next_run(builder):
    _store(builder)
    with serve(FakeJudge()) as url:
        first = score_store(builder.data, judge=_cfg(url, max_steps=2))
        second = score_store(builder.data, judge=_cfg(url))
    assert (first.judge.judged, second.judge.judged) == (2, 1)


@pytest.mark.parametrize(
    ("text", "expected"),
    [('{"score": 4, "explanation": "fine", "taxonomy_l3": null}', 4),
     ('```json\n{"score": 2, "explanation": "bad", "taxonomy_l3": "refusal"}\n```', 2),
     ('{"score": 4.0, "explanation": "fine"}', 4),
     ('{"score": "4", "explanation": "fine"}', None),
     ('{"score": 0, "explanation": "x"}', None),
     ('{"score": true, "explanation": "x"}', None),
     ('{"score": 3}', None),
     ('[1, 2]', None),
     ("", None)],
)
def test_parse_verdict(text, expected):
    if expected is not None:
        assert parse_verdict(text).score == expected
    else:
        with pytest.raises(ValueError):
            parse_verdict(text)


def test_unknown_judge_category_becomes_unclassified(builder):
    spans = [STEPS[2]]
    builder.spans(spans)
    builder.build(spans)
    with serve(FakeJudge(default=lambda b: verdict(2, "bad_vibes", "weak"))) as url:
        score_store(builder.data, judge=_cfg(url))
    row = _judge_rows(builder.data)["llm1"]
    assert row[4:6] == ("unclassified", "unclassified")
    assert row[6].startswith("unclassified: judge category 'bad_vibes' is not in the taxonomy")


def test_helpers():
    assert model_family("openai/gpt-4o-mini") == model_family("gpt-4.1") == "openai"
    assert model_family("claude-3-5-sonnet-latest") == "anthropic"
    assert model_family("meta-llama/Llama-3.1-8B-Instruct") == "meta"
    assert model_family("o3-mini") == "openai" and model_family("mystery-model") is None

    class R:
        headers = {"retry-after": "2"}

    assert retry_after_seconds(R()) == 2.0
    R.headers = {"retry-after-ms": "250", "retry-after": "9"}
    assert retry_after_seconds(R()) == 0.25


def test_cli_score_with_judge_from_env(builder):
    from click.testing import CliRunner

    from tracedag.pipeline.cli import cli

    _store(builder)
    with serve(FakeJudge()) as url:
        env = {"TRACEDAG_JUDGE_MODEL": "gpt-4o-mini", "TRACEDAG_JUDGE_BASE_URL": url, "TRACEDAG_JUDGE_API_KEY": "k",
               "TRACEDAG_JUDGE_PRICE_IN": "1", "TRACEDAG_JUDGE_PRICE_OUT": "2", "COLUMNS": "200"}
        out = CliRunner(env=env).invoke(cli, ["score", "--data", str(builder.data), "--no-progress"])
    assert out.exit_code == 0, out.output
    assert "judge: gpt-4o-mini" in out.output and "$0.0004" in out.output  # (300 * 1 + 60 * 2) / 1e6
    assert "same model family as the agent's gpt-4o" in out.output.replace("\n", " ")
    assert "unfaithful_output" in out.output and "timeout" not in out.output
    assert len(_judge_rows(builder.data)) == 3


def test_broken_http_body_is_a_recorded_error_not_a_crash(builder):
    spans = [STEPS[2]]
    builder.spans(spans)
    builder.build(spans)
    fake = FakeJudge()
    fake.script = [(200, {}, "RAW:<html>bad gateway</html>", 0.0)] * 3
    with serve(fake) as url:
        stats = score_store(builder.data, judge=_cfg(url, max_retries=2, parse_retries=0))
    assert (stats.judge.judged, stats.judge.errors, stats.judge.retries, len(fake.requests)) == (0, 1, 2, 3)
    assert "JSONDecodeError" in stats.judge.error_samples[0]
    assert _judge_rows(builder.data) == {}


def test_endpoint_without_json_mode(builder):
    spans = [STEPS[2], {**STEPS[1], "parent_span_id": None, "status_code": 0, "error_type": None}]
    builder.spans(spans)
    builder.build(spans)
    fake = FakeJudge()
    fake.script = [(400, {}, "response_format json_object is not supported by this model", 0.0)]
    with serve(fake) as url:
        stats = score_store(builder.data, judge=_cfg(url, concurrency=1))
    bodies = [b for _, b in fake.requests]
    assert "response_format" in bodies[0]
    assert all("response_format" not in b for b in bodies[1:]) and len(bodies) == 3
    assert (stats.judge.judged, stats.judge.errors, stats.judge.retries) == (2, 0, 0)


def test_config_from_env_and_cli_price(builder):
    from click.testing import CliRunner

    from tracedag.pipeline.cli import cli
    from tracedag.pipeline.score.judge.config import JudgeNotConfigured

    env = {"TRACEDAG_JUDGE_MODEL": "m", "OPENAI_API_KEY": "sk", "TRACEDAG_JUDGE_PRICE_IN": "0.5",
           "TRACEDAG_JUDGE_PRICE_OUT": "1.5", "TRACEDAG_JUDGE_CONCURRENCY": "3"}
    cfg = JudgeConfig.from_env(env)
    assert (cfg.model, cfg.api_key, cfg.prices(), cfg.concurrency, cfg.base_url) == ("m", "sk", (0.5, 1.5), 3, None)
    assert JudgeConfig.from_env({"TRACEDAG_JUDGE_MODEL": "gpt-4o-mini-2024-07-18"}).prices() == (0.15, 0.60)
    with pytest.raises(JudgeNotConfigured, match="TRACEDAG_JUDGE_TIMEOUT"):
        JudgeConfig.from_env({"TRACEDAG_JUDGE_MODEL": "m", "TRACEDAG_JUDGE_TIMEOUT": "soon"})
    with pytest.raises(JudgeNotConfigured, match="no model"):
        JudgeConfig.from_env({})
    with pytest.raises(JudgeNotConfigured, match="no API key"):
        JudgeConfig.from_env({"TRACEDAG_JUDGE_MODEL": "m"}).with_key()
    _store(builder)
    with serve(FakeJudge()) as url:
        out = CliRunner(env={"COLUMNS": "200"}).invoke(cli, [
            "score", "--data", str(builder.data), "--no-progress", "--judge", "--judge-model", "judge-x",
            "--judge-base-url", url, "--judge-price", "10", "20"])
    assert out.exit_code == 0, out.output
    assert "$0.0042" in out.output  # (300 * 10 + 60 * 20) / 1e6; no key needed for a custom endpoint


def test_a_new_rubric_metric_is_judged_on_the_next_run(builder, tmp_path):
    import yaml

    from tracedag.pipeline.score.judge.rubrics import load_rubrics

    llm = load_rubrics()["llm"][0]
    doc = {"id": llm.id, "version": llm.version, "step_type": "llm", "metric": llm.metric, "question": llm.question,
           "anchors": llm.anchors, "failure_categories": list(llm.failure_categories),
           "examples": list(llm.examples)}
    rubric_dir = tmp_path / "rubrics"
    rubric_dir.mkdir()
    (rubric_dir / "llm.response_quality.yaml").write_text(yaml.safe_dump(doc))
    spans = [STEPS[2]]
    builder.spans(spans)
    builder.build(spans)
    with serve(FakeJudge()) as url:
        first = score_store(builder.data, judge=_cfg(url, rubric_dir=rubric_dir))
        doc.update(id="llm.conciseness", metric="conciseness", version="0.1.0")
        (rubric_dir / "llm.conciseness.yaml").write_text(yaml.safe_dump(doc))
        second = score_store(builder.data, judge=_cfg(url, rubric_dir=rubric_dir))
    assert (first.judge.judged, second.judge.judged, second.judge.calls) == (1, 1, 1)
    con = connect(builder.data)
    metrics = con.execute("select metric, rubric_version from step_scores where source = 'judge' order by 1").fetchall()
    con.close()
    assert metrics == [("conciseness", "llm.conciseness@0.1.0"), ("response_quality", "llm.response_quality@1.0.0")]
