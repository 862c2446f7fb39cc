"""workflow_scores, step_stats and trace_summary on the hand-built fixture store (expected values by hand)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracedag.pipeline.store.querying import run_named


def rows(query_store: Path, name: str, **params: str) -> list[dict[str, object]]:
    return run_named(query_store, name, params).to_pylist()


# weight = 1 + desc(v), the steps that depend on v (AgentEval): its call-tree ancestors (a child feeds
# its parent) and the siblings that start after it, or after an ancestor, ended (the builder's order).
# score = sum(w) / sum(w / s); unscored steps count as 5.
WORKFLOW = {
    # r (w1, 2.0), s1 (w5: s2 s3 s4 r) 1.0, s2 (w4) 2.0, s3 (w3) 2.0, s4 (w2) 1.5:
    # 15 / (1/2 + 5 + 4/2 + 3/2 + 2/1.5) = 15 / (31/3) = 45/31
    "t1-chain": (5, 5, 5, 45 / 31, False),
    # by time, not by the hand-made edges: a1 (10-20) is followed by a2 (22), b2 (23) and j (32), so
    # a1 (w5: a2 b2 j r2) 2, b1 (21, w5) 1.5, a2 (30, w3: j r2) 1, b2 (w3) 2, j (w2) 1, r2 unscored 5 (w1):
    # 19 / (5/2 + 5/1.5 + 3 + 3/2 + 2 + 1/5) = 19 / (188/15) = 285/188
    "t2-converge": (6, 5, 5, 285 / 188, False),
    # c1 recovered by its retry weighs 1 (nothing used its result; desc would be c2 m r3), c2 (w3)
    # min(5, 4) = 4, m (w2) 2.0, r3 (w1) 4.0: 7 / (1 + 3/4 + 1 + 1/4) = 7/3
    "t3-retry": (4, 4, 2, 7 / 3, False),
    # x (w4: k z r4) 1 (human), y (w4) 1, k (w3) 2, z (w2) 4 (human), r4 unscored -> 5 (w1):
    # 14 / (4 + 4 + 3/2 + 1/2 + 1/5) = 14 / 10.2 = 70/51
    "t4-ties": (5, 4, 3, 70 / 51, False),
    # q (w2) 4.0, r5 (w1) 5.0: 3 / (2/4 + 1/5) = 30/7
    "t5-clean": (2, 2, 0, 30 / 7, True),
    # flat: no edges, nothing depends on anything, every weight 1: f0 unscored -> 5, f1 1, f2 2: 3 / (1/5 + 1 + 1/2) = 30/17
    "t6-flat": (3, 2, 2, 30 / 17, False),
}


def test_workflow_scores_weighted_harmonic_mean(query_store: Path) -> None:
    got = {r["trace_id"]: (r["steps"], r["scored_steps"], r["failed_steps"], r["workflow_score"], r["passed"])
           for r in rows(query_store, "workflow_scores")}
    assert got == {k: (*v[:3], pytest.approx(v[3]), v[4]) for k, v in WORKFLOW.items()}


def test_workflow_scores_leave_unscored_steps_out_when_asked(query_store: Path) -> None:
    got = {r["trace_id"]: r["workflow_score"] for r in rows(query_store, "workflow_scores", unscored_score="-1")}
    # t2 without r2: 18 / (5/2 + 5/1.5 + 3 + 3/2 + 2) = 18 / (37/3) = 54/37; t4 without r4: 13 / 10;
    # t6 without f0: 2 / 1.5
    assert got["t2-converge"] == pytest.approx(54 / 37)
    assert got["t4-ties"] == pytest.approx(1.3)
    assert got["t6-flat"] == pytest.approx(4 / 3)
    assert got["t1-chain"] == pytest.approx(45 / 31)


def test_pass_threshold_is_a_parameter(query_store: Path) -> None:
    got = {r["trace_id"] for r in rows(query_store, "workflow_scores", pass_threshold="1.6") if r["passed"]}
    assert got == {"t3-retry", "t5-clean", "t6-flat"}  # 2.333, 4.286, 1.765 >= 1.6; t2's 1.516 is not


def test_step_stats_per_step(query_store: Path) -> None:
    got = {(r["step_type"], r["step_name"]): r for r in rows(query_store, "step_stats") if r["grain"] == "step"}
    answer = got[("llm", "answer")]  # s3 (9 ms, failed, gpt-4o 1000/200) and q (20 ms, ok, gpt-4o 500/100)
    assert (answer["runs"], answer["failures"], answer["failure_rate"]) == (2, 1, 0.5)
    assert answer["p50_ms"] == pytest.approx(14.5)
    assert answer["p90_ms"] == pytest.approx(9 + 0.9 * 11)
    assert (answer["input_tokens"], answer["output_tokens"]) == (1500, 300)
    assert answer["cost_usd"] == pytest.approx((1500 * 2.50 + 300 * 10.00) / 1e6)
    merge = got[("llm", "merge")]  # gpt-4o-mini matches its own (longer) price row, not gpt-4o's
    assert merge["cost_usd"] == pytest.approx((2000 * 0.15 + 1000 * 0.60) / 1e6)
    call = got[("tool", "call_api")]  # the failed first try counts as a failed run
    assert (call["runs"], call["failures"], call["p50_ms"]) == (2, 1, pytest.approx(9.5))
    assert len(got) == 22


def test_step_stats_turn_latency(query_store: Path) -> None:
    turn = [r for r in rows(query_store, "step_stats") if r["grain"] == "turn"]
    assert len(turn) == 1
    t = turn[0]
    # trace durations 100, 50, 60, 50, 30, 40 ms -> sorted 30 40 50 50 60 100
    assert (t["runs"], t["failures"]) == (6, 5)  # every trace but t5 has an unrecovered failure
    assert t["p50_ms"] == pytest.approx(50.0)
    assert t["p90_ms"] == pytest.approx(60 + 0.5 * 40)
    assert (t["input_tokens"], t["output_tokens"]) == (3500, 1300)
    assert t["cost_usd"] == pytest.approx((1500 * 2.5 + 300 * 10 + 2000 * 0.15 + 1000 * 0.6) / 1e6)


def test_step_stats_default_price_for_unknown_models(query_store: Path) -> None:
    got = {r["step_name"]: r["cost_usd"] for r in rows(query_store, "step_stats", default_input_per_mtok="1000")}
    assert got["answer"] == pytest.approx((1500 * 2.50 + 300 * 10.00) / 1e6)  # known model: list price
    assert got["search"] == 0.0  # no tokens, nothing to pay


def test_trace_summary_one_row_per_trace(query_store: Path) -> None:
    got = {r["trace_id"]: (r["failed_steps"], r["unrecovered_failures"], r["originating_failures"],
                           r["root_cause_span_id"], r["root_cause_category"], r["passed"], r["method"])
           for r in rows(query_store, "trace_summary")}
    assert got == {
        "t1-chain": (5, 5, 1, "s1", "tool_execution", False, "inferred"),
        "t2-converge": (5, 5, 2, "a1", "tool_execution", False, "inferred"),
        "t3-retry": (2, 1, 1, "m", "generation", False, "inferred"),
        "t4-ties": (3, 3, 2, "x", "context_loss", False, "inferred"),
        "t5-clean": (0, 0, 0, None, None, True, "inferred"),
        "t6-flat": (2, 2, 2, "f2", "unclassified", False, "flat"),
    }
    scores = {r["trace_id"]: r["workflow_score"] for r in rows(query_store, "trace_summary")}
    assert scores == {k: pytest.approx(v[3]) for k, v in WORKFLOW.items()}
