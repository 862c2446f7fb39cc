"""Response consistency: the offline measure and a judge behind a real local chat-completions server."""

from __future__ import annotations

import pytest

from tests.realspans import chat_completion, fake_openai_server
from tracedag.pipeline.analysis.determinism import analyze_runs
from tracedag.pipeline.analysis.response import (
    JudgeFailed,
    TokenJaccardScorer,
    make_scorer,
    tokens,
)
from tracedag.pipeline.analysis.trajectories import Run


def run(key, response, variant=None, replay=0):
    r = Run(run_key=key, agent="ag", agent_version=None, scenario="s", variant_id=variant,
            replay_index=replay, start_ns=replay)
    r.nodes, r.node_failed, r.node_turn = ["A"], [False], [0]
    r.responses, r.trace_ids = [response], [key]
    return r


RUNS = [
    run("b0", "Court 3 is booked for Friday at 6pm.", replay=0),
    run("b1", "Booked court 3, Friday 6pm.", replay=1),
    run("v1", "Your court is booked: Friday 18:00, court 3.", "polite"),
    run("v2", "Court 3 booked for Friday evening.", "terse"),
    run("v3", "Sorry, no court is free on Friday.", "late"),
]


def test_judge_scores_variants_and_replays_through_the_openai_client():
    # the replays once, then each variant with each exact replay: (v1, b0) (v1, b1) (v2, b0) ...
    replies = [(200, chat_completion(d)) for d in ("3", "4", "4", "4", "4", "3", "3")]
    with fake_openai_server(replies) as srv:
        scorer = make_scorer("judge-model-x", srv.base_url)
        rows = analyze_runs(RUNS, scorer=scorer).tables["determinism"].to_pylist()
    replays = next(r for r in rows if r["comparison"] == "replays")
    variants = next(r for r in rows if r["comparison"] == "variants")
    assert replays["response_consistency"] == 3.0
    # per variant 4, 4 and 3 over the two replays -> 22/6 = 3.67
    assert variants["response_consistency"] == pytest.approx(22 / 6)
    assert round(variants["response_consistency"], 2) == 3.67
    assert variants["response_consistency_method"] == "judge:judge-model-x"
    assert len(srv.requests) == 7
    first = srv.requests[0]
    assert first["model"] == "judge-model-x" and first["temperature"] == 0
    assert "4 = all agree" in first["messages"][0]["content"]
    # each variant is compared with each exact replay (EDGE), not with one reference reply
    pairs = [(b, v) for v in RUNS[2:] for b in RUNS[:2]]
    for req, (base, variant) in zip(srv.requests[1:], pairs, strict=True):
        user = req["messages"][1]["content"]
        assert base.final_response in user and variant.final_response in user


def test_judge_answer_outside_the_scale_is_an_error():
    with fake_openai_server([(200, chat_completion("excellent"))]) as srv:
        scorer = make_scorer("m", srv.base_url)
        with pytest.raises(JudgeFailed, match="not a digit"):
            scorer.agreement(["a", "b"])


def test_judge_transport_failure_is_an_error():
    with fake_openai_server([(400, {"error": {"message": "bad model"}})]) as srv:
        scorer = make_scorer("m", srv.base_url)
        with pytest.raises(JudgeFailed, match="bad model"):
            scorer.agreement(["a", "b"])


def test_offline_scorer_without_a_model():
    scorer = make_scorer(None)
    assert isinstance(scorer, TokenJaccardScorer)
    assert scorer.method == "token_jaccard_offline"
    assert scorer.agreement(["Hello, World!", "hello world"]) == 4.0
    assert scorer.agreement(["a", "b"]) == 1.0
    assert scorer.agreement(["only one"]) == 4.0
    # three responses: pairs (ab, ab)=1, (ab, a)=1/2, (ab, a)=1/2 -> mean 2/3 -> 3.0
    assert scorer.agreement(["a b", "a b", "a"]) == pytest.approx(3.0)
    assert tokens("Ça va? Oui.") == {"ça", "va", "oui"}


def test_determinism_command_with_a_judge(store):
    from click.testing import CliRunner

    from tracedag.pipeline.cli import cli

    store.run("r1", "s", [[("A", [])]], replay=0, responses=["yes, booked"])
    store.run("r2", "s", [[("A", [])]], replay=1, responses=["booked it"])
    data = store.write()
    with fake_openai_server([(200, chat_completion("4"))]) as srv:
        res = CliRunner().invoke(cli, ["determinism", "--data", str(data), "--judge-model", "jm",
                                       "--judge-base-url", srv.base_url], env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    assert "4.00 (judge:jm)" in res.output
    assert "offline" not in res.output
    with fake_openai_server([(200, chat_completion("great"))]) as srv:
        res = CliRunner().invoke(cli, ["determinism", "--data", str(data), "--judge-model", "jm",
                                       "--judge-base-url", srv.base_url], env={"COLUMNS": "250"})
    assert res.exit_code != 0
    assert "judge jm" in res.output and "not a digit" in res.output
