"""``--merge semantic``: sibling states an LLM calls the same step merge when it is confident enough.

The LLM is the judge tests' local chat-completions server (``tests.score.test_judge``), reached through
the real ``openai`` client by ``score.judge.same_step``; its answers are scripted per pair of names.
"""

from __future__ import annotations

import json
import logging

import pytest
from click.testing import CliRunner

from tests.score.test_judge import FakeJudge, serve
from tests.validate.validate_support import run
from tracedag.pipeline.cli import cli
from tracedag.pipeline.dag import build_store
from tracedag.pipeline.score import score_store
from tracedag.pipeline.score.judge.cache import JudgeCache
from tracedag.pipeline.score.judge.config import JudgeConfig
from tracedag.pipeline.score.judge.same_step import SameStepJudge, parse_same_step
from tracedag.pipeline.validate import read_model
from tracedag.pipeline.validate.checking import check_runs
from tracedag.pipeline.validate.learning import LearnOptions, learn_model
from tracedag.pipeline.validate.model import save_model

SYNONYMS = {frozenset({"check_availability", "availability_check"})}


def pair_of(body: dict) -> frozenset[str]:
    lines = body["messages"][1]["content"].splitlines()
    return frozenset(line.split(": ", 1)[1] for line in lines if line.startswith(("Step A: ", "Step B: ")))


def answering(confidence: float):
    """An LLM that calls the synonyms the same step with ``confidence`` and anything else different."""

    def answer(body: dict) -> str:
        if pair_of(body) in SYNONYMS:
            return json.dumps({"same": True, "confidence": confidence, "reason": "both check the free slots"})
        return json.dumps({"same": False, "confidence": 0.95, "reason": "different actions"})

    return answer


RUNS = [run("router", "check_availability", "book", "done"), run("router", "availability_check", "book", "done"),
        run("router", "faq", "check_availability", "book", "done")]


@pytest.fixture
def llm(tmp_path):
    """(fake server, asker factory): ``ask(confidence)`` is a SameStepJudge on a fresh cache."""
    fake = FakeJudge(answering(0.95))
    with serve(fake) as url:
        made: list[SameStepJudge] = []

        def asker(cache_name: str = "cache.sqlite") -> SameStepJudge:
            cfg = JudgeConfig(model="fake-llm", base_url=url, timeout_s=5.0, max_backoff_s=0.01)
            made.append(SameStepJudge(cfg, JudgeCache(tmp_path / cache_name)))
            return made[-1]

        yield fake, asker
        for a in made:
            a.close()


def learn(asker, min_confidence=0.9, runs=RUNS):
    return learn_model(runs, LearnOptions(state="node", merge="semantic", min_confidence=min_confidence), {}, None,
                       asker)


def test_synonyms_merge_when_the_llm_is_confident(llm, tmp_path):
    fake, asker = llm
    model = learn(asker())
    s = model.scenarios["s"]
    # without the merge neither name is on every path; merged, checking availability is essential
    assert s.essential == ["router", "check_availability", "book", "done"]
    assert s.state("check_availability").names == ["availability_check", "check_availability"]
    assert s.state("availability_check") is None
    [merge] = s.semantic_merges
    assert merge["names"] == ["availability_check", "check_availability"]
    assert merge["into"] == "check_availability"  # the name more runs use
    assert merge["confidence"] == 0.95 and merge["model"] == "fake-llm" and merge["after"] == "router"
    assert model.merge == "semantic"
    assert model.learned_from["semantic_merge"]["merged"] == 1
    asked = {pair_of(b) for _, b in fake.requests}
    assert frozenset({"check_availability", "availability_check"}) in asked
    assert frozenset({"check_availability", "faq"}) not in asked  # one run visits both


def test_siblings_the_llm_calls_different_stay_apart(llm):
    fake, asker = llm
    model = learn(asker(), runs=[run("router", "faq", "done"), run("router", "book", "done")])
    assert model.scenarios["s"].semantic_merges == []
    assert model.learned_from["semantic_merge"]["not_same"] == 1
    assert {pair_of(b) for _, b in fake.requests} == {frozenset({"faq", "book"})}


def test_the_model_file_lists_the_merge_and_check_applies_it(llm, tmp_path):
    _, asker = llm
    path = tmp_path / "model.json"
    save_model(learn(asker()), path)
    doc = json.loads(path.read_text())
    assert doc["merge"] == "semantic"
    assert doc["learned_from"]["semantic_merge"]["model"] == "fake-llm"
    assert doc["scenarios"]["s"]["semantic_merges"][0]["names"] == ["availability_check", "check_availability"]
    model = read_model(path)
    renamed = run("router", "availability_check", "book", "done")
    rows = check_runs([renamed], model, str(path)).to_pylist()
    assert [r["passed"] for r in rows] == [True]
    # undo: delete the entry; check then treats availability_check as another state
    doc["scenarios"]["s"]["semantic_merges"] = []
    path.write_text(json.dumps(doc))
    model = read_model(path)
    assert check_runs([renamed], model, str(path)).to_pylist()[0]["passed"] is False


def test_below_the_threshold_nothing_merges_and_at_it_the_pair_merges(llm, tmp_path):
    fake, asker = llm
    fake.default = answering(0.89)
    s = learn(asker("a.sqlite")).scenarios["s"]
    assert s.semantic_merges == []
    assert s.state("availability_check") is not None
    assert s.essential == ["router", "book", "done"]
    fake.default = answering(0.9)
    s = learn(asker("b.sqlite")).scenarios["s"]
    assert [m["confidence"] for m in s.semantic_merges] == [0.9]


def test_a_malformed_answer_merges_nothing_and_learning_goes_on(llm, caplog):
    fake, asker = llm
    fake.default = lambda body: "Sure! They look like the same step to me."
    with caplog.at_level(logging.WARNING):
        model = learn(asker())
    s = model.scenarios["s"]
    assert s.semantic_merges == []
    assert {"check_availability", "availability_check"} <= {x.name for x in s.states}
    assert model.learned_from["semantic_merge"]["failed"] >= 1
    assert "no answer for" in caplog.text


def test_a_refusing_endpoint_merges_nothing(llm, caplog):
    fake, asker = llm
    fake.script = [(400, {}, "model not found", 0.0)] * 10
    with caplog.at_level(logging.WARNING):
        s = learn(asker()).scenarios["s"]
    assert s.semantic_merges == []
    assert "no answer for" in caplog.text


def test_a_timing_out_endpoint_merges_nothing(llm, tmp_path, caplog):
    fake, _ = llm
    with serve(fake) as url:
        cfg = JudgeConfig(model="fake-llm", base_url=url, timeout_s=0.2, max_backoff_s=0.01)
        slow = SameStepJudge(cfg, JudgeCache(tmp_path / "slow.sqlite"))
        fake.script = [(200, {}, None, 1.0)] * 4
        try:
            with caplog.at_level(logging.WARNING):
                s = learn(slow).scenarios["s"]
        finally:
            slow.close()
    assert s.semantic_merges == []
    assert "no answer for" in caplog.text


def test_answers_are_cached(llm):
    fake, asker = llm
    learn(asker())
    first = len(fake.requests)
    assert first >= 1
    learn(asker())  # the same cache file
    assert len(fake.requests) == first


def test_names_one_run_visits_both_of_are_never_asked(llm):
    fake, asker = llm
    runs = [run("router", "check_availability", "done"), run("router", "availability_check", "done"),
            run("x", "check_availability", "availability_check", "done")]
    s = learn(asker(), runs=runs).scenarios["s"]
    assert s.semantic_merges == []
    assert frozenset({"check_availability", "availability_check"}) not in {pair_of(b) for _, b in fake.requests}


def test_answer_validation():
    assert parse_same_step('{"same": true, "confidence": 1, "reason": "x"}').confidence == 1.0
    for bad in ('{"same": "yes", "confidence": 0.9}', '{"same": true, "confidence": 1.5}', "[1]", "no json"):
        with pytest.raises(ValueError):
            parse_same_step(bad)


BOOK = [("router", []), ("check_availability", []), ("book_court", []), ("finalize", [])]
SYN = [("router", []), ("availability_check", []), ("book_court", []), ("finalize", [])]


def test_cli_learns_with_a_local_llm_and_refuses_without_one(store, tmp_path, monkeypatch):
    for i, steps in enumerate([BOOK, SYN, BOOK]):
        store.run(f"book-{i}", "book", [steps], replay=i, agent="agentA")
    data = store.write()
    build_store(data, idle_seconds=0)
    score_store(data)
    for var in ("TRACEDAG_JUDGE_MODEL", "TRACEDAG_JUDGE_BASE_URL", "TRACEDAG_JUDGE_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    out = tmp_path / "m.json"
    args = ["validate", "learn", "--data", str(data), "--state", "node", "--merge", "semantic", "--out", str(out)]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 2 and "TRACEDAG_JUDGE_MODEL" in r.output and not out.exists()
    fake = FakeJudge(answering(0.97))
    with serve(fake) as url:
        r = CliRunner().invoke(cli, [*args, "--judge-model", "fake-llm", "--judge-base-url", url])
    assert r.exit_code == 0, r.output
    assert "availability_check = check_availability -> check_availability (0.97)" in r.output
    doc = json.loads(out.read_text())
    assert doc["scenarios"]["book"]["semantic_merges"][0]["into"] == "check_availability"
    essential = [s["name"] for s in doc["scenarios"]["book"]["states"] if s["essential"]]
    assert essential == ["router", "check_availability", "book_court", "finalize"]


def test_a_bad_merge_entry_is_named(llm, tmp_path):
    from tracedag.pipeline.validate.model import ModelInvalid

    _, asker = llm
    path = tmp_path / "model.json"
    save_model(learn(asker()), path)
    doc = json.loads(path.read_text())
    doc["scenarios"]["s"]["semantic_merges"][0]["names"] = ["check_availability"]
    path.write_text(json.dumps(doc))
    with pytest.raises(ModelInvalid, match=r"scenarios\.s\.semantic_merges\[0\]\.names"):
        read_model(path)
