"""Variants: K rewrites of every user turn, offline rules or a model, labelled v1..vK."""

from __future__ import annotations

import shutil

import pyarrow.parquet as pq
import pytest

from tests.dag.spanbuild import q
from tests.realspans import chat_completion, fake_openai_server
from tests.replay.replay_support import BOOKING_TURNS, INFO_TURNS, example_store, in_process
from tests.replay.test_replay_cli import _tracedag
from tracedag.pipeline.demo.agent.fake_llm import ScriptedLLM
from tracedag.pipeline.replay.variants import RuleRewriter, candidates


@pytest.mark.parametrize("text", [*BOOKING_TURNS, *INFO_TURNS, "No thanks, maybe later.", "ok"])
def test_rules_are_deterministic_differ_and_keep_what_the_user_asks(text):
    import random

    llm = ScriptedLLM(random.Random(0), latency_scale=0)
    seen = llm.understand(text)
    rewrites = [RuleRewriter().rewrite(text, k) for k in range(1, 7)]
    assert rewrites == [RuleRewriter().rewrite(text, k) for k in range(1, 7)]
    assert all(r != text for r in rewrites)
    n = len(candidates(text))
    assert n >= 2 and len(set(rewrites[:n])) == min(n, 6)
    for r in rewrites:  # same intent, day, time and yes/no for the example agent's understanding
        got = llm.understand(r)
        assert (got.intent, got.date, got.time, got.accepts) == (seen.intent, seen.date, seen.time, seen.accepts), r


def test_offline_variants_are_replayed_and_labelled(tmp_path):
    data = example_store(tmp_path / "data", {"c-book": BOOKING_TURNS})
    res = in_process("replay", "--data", data, "--agent", "example", "--agent-opt", "fault_rate=0",
                     "--agent-opt", "noise=0", "--variants", "2", "--times", "2", "--replay-id", "rv")
    assert res.returncode == 0, res.stdout + res.stderr
    runs = q(data, """select run_id, any_value(variant_id), any_value(replay_index) from spans
                      where run_id like 'rv/%' group by 1 order by 1""")
    assert runs == [("rv/c-book/r0", None, 0), ("rv/c-book/r1", None, 1), ("rv/c-book/v1/r0", "v1", 0),
                    ("rv/c-book/v1/r1", "v1", 1), ("rv/c-book/v2/r0", "v2", 0), ("rv/c-book/v2/r1", "v2", 1)]
    first = q(data, """select variant_id, ev.attributes['content'] from
                       (select variant_id, unnest(events) as ev from spans where run_id like 'rv/%/r0')
                       where ev.name = 'gen_ai.user.message' order by ev.time_unix_nano""")
    by_variant: dict = {}
    for variant, text in first:
        by_variant.setdefault(variant, []).append(text)
    assert by_variant[None] == list(BOOKING_TURNS)
    assert by_variant["v1"] == [RuleRewriter().rewrite(t, 1) for t in BOOKING_TURNS]
    assert in_process("build", "--data", data).returncode == 0
    det = in_process("determinism", "--data", data, "--output", tmp_path / "det")
    assert det.returncode == 0, det.stderr
    rows = pq.read_table(tmp_path / "det" / "determinism.parquet").to_pylist()
    kinds = {(r["scenario"], r["comparison"]): r for r in rows if r["scenario"] == "c-book"}
    assert ("c-book", "variants") in kinds and kinds[("c-book", "variants")]["variants"] == 2


def test_model_rewriter_through_an_openai_compatible_endpoint(tmp_path):
    data = example_store(tmp_path / "data", {"c-info": INFO_TURNS})
    with fake_openai_server([(200, chat_completion("When do you open?"))]) as srv:
        res = in_process("replay", "--data", data, "--agent", "tests.replay.agents:echo", "--variants", "1",
                         "--rewrite-model", "rw-1", "--rewrite-base-url", srv.base_url, "--replay-id", "rm")
        requests = list(srv.requests)
    assert res.returncode == 0, res.stdout + res.stderr
    assert len(requests) == 1 and requests[0]["model"] == "rw-1" and requests[0]["temperature"] == 0
    assert requests[0]["messages"][-1] == {"role": "user", "content": INFO_TURNS[0]}
    outputs = q(data, "select variant_id, output_text from spans where run_id like 'rm/%' order by 1 nulls first")
    assert outputs == [(None, f"0: {INFO_TURNS[0]}"), ("v1", "0: When do you open?")]


def test_failing_rewriter_names_the_conversation(tmp_path):
    data = example_store(tmp_path / "data", {"c-info": INFO_TURNS})
    copy = tmp_path / "copy"
    shutil.copytree(data, copy)
    with fake_openai_server([(500, {"error": {"message": "down"}})] * 3) as srv:
        res = _tracedag("replay", "--data", copy, "--agent", "example", "--variants", "1",
                        "--rewrite-model", "rw-1", "--rewrite-base-url", srv.base_url)
    assert res.returncode != 0 and "conversation c-info: rewriting variant v1 failed" in res.stderr
    assert "Traceback" not in res.stderr
