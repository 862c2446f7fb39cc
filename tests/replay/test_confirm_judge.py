"""A model-step root cause with no passing run of its scenario: the correction is written through the judge's
OpenAI-compatible endpoint (a local server, the real ``openai`` client) and recorded with the verdict."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.replay import confirm_agents
from tests.replay.test_confirm import _checks, _record, _root_causes
from tests.score.test_judge import FakeJudge, serve
from tracedag import instrument as td
from tracedag.pipeline.cli import cli

FIXED = "I found TD505 to Paris."


@pytest.fixture(name="model_down")
def model_down_fixture(tmp_path: Path) -> Path:
    """One conversation whose model step failed (the model overloaded); no passing run of its scenario."""
    def hold() -> Iterator[str]:
        confirm_agents.BROKEN.update({"answer"})
        try:
            with td.conversation("m-down"), td.run_labels(scenario_id="paris"):
                confirm_agents.travel([{"role": "user", "content": "I am alex, find flights to Paris"}])
            yield "m-down"
        finally:
            confirm_agents.BROKEN.clear()

    return _record(tmp_path / "model", "travel", hold)


def _confirm(data: Path, env: dict[str, str]) -> object:
    confirm_agents.BROKEN.add("answer")  # the model is still down: only the replaced output can answer
    try:
        return CliRunner(env=env).invoke(cli, ["confirm", "--data", str(data), "--agent",
                                               "tests.replay.confirm_agents:travel", "--times", "2"])
    finally:
        confirm_agents.BROKEN.clear()


def _judge_env(url: str) -> dict[str, str]:
    return {"TRACEDAG_JUDGE_MODEL": "judge-x-1", "TRACEDAG_JUDGE_BASE_URL": url, "TRACEDAG_JUDGE_API_KEY": "k"}


def test_the_judge_writes_the_correction_and_it_is_recorded(model_down: Path) -> None:
    cause = _root_causes(model_down)["m-down"]
    assert cause["root_step_name"] == "chat travel-model"
    fake = FakeJudge(default=lambda body: FIXED)
    with serve(fake) as url:
        out = _confirm(model_down, _judge_env(url))
    assert out.exit_code == 0, out.output
    check = _checks(model_down)["m-down"]
    assert (check["verdict"], check["runs"], check["failures_after"]) == ("confirmed", 2, 0)
    assert (check["replacement_kind"], check["replacement_source"]) == ("judge", "judge:judge-x-1")
    assert check["replacement_output"] == FIXED
    [(_, body)] = fake.requests  # asked once, while the check was planned
    assert body["temperature"] == 0 and body["model"] == "judge-x-1"
    asked = body["messages"][1]["content"]
    assert "STEP: chat travel-model" in asked and "model endpoint: HTTP 529 overloaded" in asked
    assert _root_causes(model_down)["m-down"]["confirmed"] == "confirmed"


def test_without_a_judge_or_with_a_failing_one_the_check_is_inconclusive(model_down: Path) -> None:
    out = _confirm(model_down, {"TRACEDAG_JUDGE_MODEL": ""})
    assert out.exit_code == 0, out.output
    check = _checks(model_down)["m-down"]
    assert (check["verdict"], check["runs"], check["replacement_kind"]) == ("inconclusive", 0, None)
    assert "and no judge to write a correction (TRACEDAG_JUDGE_MODEL)" in str(check["reason"])
    fake = FakeJudge()
    fake.script.append((400, {}, "bad request", 0.0))  # not retried
    with serve(fake) as url:
        out = _confirm(model_down, _judge_env(url))
    assert out.exit_code == 0, out.output
    check = _checks(model_down)["m-down"]
    assert (check["verdict"], check["replacement_kind"]) == ("inconclusive", None)
    assert "the judge judge-x-1 answered HTTP 400" in str(check["reason"])
