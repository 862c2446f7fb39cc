"""Issue 18 on hand-built traces (tests/queries/rca_store.py): turns of a conversation, cancelled
siblings, recovery by another route, AgentEval's direct-parent rule. Expected rows worked out by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracedag.pipeline.store.querying import run_named

ROOT = ("trace_id", "failed_span_id", "root_span_id", "hops_from_root", "kind")
TURNS = ("turn_index", "root_trace_id", "root_turn_index")


def rows(store: Path, name: str, **params: str) -> list[dict[str, object]]:
    return run_named(store, name, params).to_pylist()


def pick(result: list[dict[str, object]], *cols: str) -> list[tuple[object, ...]]:
    return [tuple(r[c] for c in cols) for r in result]


def test_per_trace_each_turn_blames_itself(rca_store: Path) -> None:
    # per=trace is unchanged: turn 2's agent (KeyError outside any tool) is its own root
    got = pick(rows(rca_store, "root_causes", trace_id="a2-agent"), *ROOT, *TURNS)
    assert got == [("a2-agent", "rb", "rb", 0, "originating", 2, "a2-agent", 2)]


def test_per_conversation_finds_the_cause_in_an_earlier_turn(rca_store: Path) -> None:
    # tl (turn 1) -> c2 -> ra (passes, the root of turn 1) -> d1 (turn 2 has no other step without an
    # upstream one) -> rb: a failure-DAG edge tl -> rb; greedy from rb moves once, to tl
    got = pick(rows(rca_store, "root_causes", per="conversation", trace_id="a2-agent"), *ROOT, *TURNS)
    assert got == [("a2-agent", "rb", "tl", 1, "propagated", 2, "a1-lookup", 1)]


def test_per_conversation_reads_the_whole_conversation_of_a_trace_in_the_window(rca_store: Path) -> None:
    # the window holds turn 1 only; its conversation's failure is in turn 2, which is read too
    got = pick(rows(rca_store, "root_causes", per="conversation", trace_id="a1-lookup"), *ROOT, *TURNS)
    assert got == [("a2-agent", "rb", "tl", 1, "propagated", 2, "a1-lookup", 1)]


def test_an_earlier_turn_never_causes_a_failure_of_the_environment(rca_store: Path) -> None:
    # conv-b: fe1 fails in turn 1, the model provider answers 500 in turn 2 (http_error on an llm
    # step): no edge fe1 -> m, so the conversation's failure rd (latest turn) goes back to m only
    got = pick(rows(rca_store, "root_causes", per="conversation", trace_id="b2-outage"), *ROOT, *TURNS)
    assert got == [("b2-outage", "rd", "m", 1, "propagated", 2, "b2-outage", 2)]


def test_one_row_per_failed_conversation(rca_store: Path) -> None:
    got = pick(rows(rca_store, "root_causes", per="conversation"), "conversation_id", "failed_span_id",
               "root_span_id")
    # t-fallback recovered; traces without a conversation id are conversations of their own
    # (by failed trace id: t-bad-answer's failure is its judged parent rf, caused by w)
    assert got == [("conv-a", "rb", "tl"), ("conv-b", "rd", "m"), (None, "rf", "w"), (None, "r", "b"),
                   (None, "w", "w"), (None, "w", "w"), (None, "pc", "pa")]


def test_propagation_per_conversation_lists_earlier_turns(rca_store: Path) -> None:
    got = {(r["trace_id"], r["span_id"]): (r["kind"], r["failing_upstream"], r["longest_chain"], r["turn_index"])
           for r in rows(rca_store, "propagation", per="conversation") if r["trace_id"][0] in "ab"}
    assert got == {
        ("a1-lookup", "tl"): ("originating", [], 0, 1),
        ("a2-agent", "rb"): ("propagated", ["a1-lookup/tl"], 1, 2),
        ("b1-fetch", "fe1"): ("originating", [], 0, 1),
        ("b2-outage", "m"): ("originating", [], 0, 2),
        ("b2-outage", "rd"): ("propagated", ["b2-outage/m"], 1, 2),
    }
    per_trace = {r["span_id"]: r["kind"] for r in rows(rca_store, "propagation", trace_id="a2-agent")}
    assert per_trace == {"rb": "originating"}


def test_cancelled_siblings_are_effects_never_roots(rca_store: Path) -> None:
    # a, c (status message "CancelledError: ") and c1 (context.Canceled) are cancelled; b failed and
    # ended (50) before each of them ended (60, 61, 61), its parent r encloses them: edges b -> a,
    # b -> c, b -> c1. Cancelled steps start no propagation, so r's only failing predecessor is b,
    # although a started first with the same score
    got = pick(rows(rca_store, "root_causes", trace_id="t-cancel", per="step"), *ROOT)
    assert got == [("t-cancel", "r", "b", 1, "propagated"), ("t-cancel", "a", "b", 1, "propagated"),
                   ("t-cancel", "b", "b", 0, "originating"), ("t-cancel", "c", "b", 1, "propagated"),
                   ("t-cancel", "c1", "b", 1, "propagated")]
    flags = {r["span_id"]: r["cancelled"] for r in rows(rca_store, "failures", trace_id="t-cancel")}
    assert flags == {"r": False, "a": True, "b": False, "c": True, "c1": True}


@pytest.mark.parametrize("strategy", ["greedy", "full_path_min", "weighted", "agenteval"])
def test_no_strategy_falls_to_a_cancelled_branch(rca_store: Path, strategy: str) -> None:
    got = pick(rows(rca_store, "root_causes", trace_id="t-cancel", strategy=strategy), "root_span_id",
               "root_cancelled")
    assert got == [("b", False)]


def test_recovery_by_another_route(rca_store: Path) -> None:
    got = {r["trace_id"]: (r["recovered"], r["recovered_by"]) for r in rows(rca_store, "failures")
           if r["span_id"] == "w"}
    assert got == {
        # get_weather_cached carries "paris" (case aside) and shares the word "weather"
        "t-fallback": (True, "k"),
        # get_news carries "paris" but shares no word of 4+ letters with get_weather
        "t-other-purpose": (False, None),
        # the same kind of tool for another city does not serve the same request
        "t-other-args": (False, None),
        # the route worked but the answer (the parent, judged 2.0) fails
        "t-bad-answer": (False, None),
    }
    assert rows(rca_store, "root_causes", trace_id="t-fallback") == []
    assert [r["recovery"] for r in rows(rca_store, "failures", trace_id="t-fallback")] == ["route"]


def test_a_retry_is_still_a_retry(query_store: Path) -> None:
    got = [(r["span_id"], r["recovered"], r["recovered_by"], r["recovery"], r["cancelled"])
           for r in rows(query_store, "failures", trace_id="t3-retry")]
    assert got == [("c1", True, "c2", "retry", False), ("m", False, None, None, False)]


def test_a_recovered_trace_passes(rca_store: Path) -> None:
    # weights (1 + steps that depend on it): m1 6 (w m2 k m3 rf), m2 4, k 3, m3 2, rf 1; w recovered
    # weighs 1. 17 / (6/5 + 1/1 + 4/5 + 3/5 + 2/5 + 1/5) = 17 / 4.2
    got = {r["trace_id"]: (r["workflow_score"], r["passed"], r["unrecovered_failures"])
           for r in rows(rca_store, "trace_summary")}
    assert got["t-fallback"] == (pytest.approx(17 / 4.2), True, 0)
    # t-other-purpose: w weighs 5 (m2 k m3 rf): 21 / (6/5 + 5/1 + 4/5 + 3/5 + 2/5 + 1/5) = 21 / 8.2
    assert got["t-other-purpose"] == (pytest.approx(21 / 8.2), False, 1)
    assert [r["workflow_score"] for r in rows(rca_store, "workflow_scores", trace_id="t-fallback")] == [
        pytest.approx(17 / 4.2)]


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        # pa -> pb (passes) -> pc: the failure DAG has pa -> pc
        ("greedy", ("t-passing", "pc", "pa", 1, "propagated")),
        ("full_path_min", ("t-passing", "pc", "pa", 1, "propagated")),
        ("weighted", ("t-passing", "pc", "pa", 1, "propagated")),
        # AgentEval: pc's only direct parent pb passed, so pc originates
        ("agenteval", ("t-passing", "pc", "pc", 0, "originating")),
    ],
)
def test_agenteval_never_propagates_through_a_passing_step(
    rca_store: Path, strategy: str, expected: tuple[object, ...]
) -> None:
    assert pick(rows(rca_store, "root_causes", trace_id="t-passing", strategy=strategy), *ROOT) == [expected]


def test_agenteval_follows_failing_direct_parents(query_store: Path) -> None:
    # t1-chain: r's failing direct parents are its children s1 (1.0), s2, s3 (2.0), s4 (1.5): s1
    got = pick(rows(query_store, "root_causes", trace_id="t1-chain", strategy="agenteval", per="step"), *ROOT)
    assert got == [("t1-chain", "r", "s1", 1, "propagated"), ("t1-chain", "s1", "s1", 0, "originating"),
                   ("t1-chain", "s2", "s1", 1, "propagated"), ("t1-chain", "s3", "s1", 2, "propagated"),
                   ("t1-chain", "s4", "s1", 3, "propagated")]
    # t2-converge: j's direct parents a2 (1.0) and b2 (2.0): a2, then a2's a1
    got = pick(rows(query_store, "root_causes", trace_id="t2-converge", strategy="agenteval"), *ROOT)
    assert got == [("t2-converge", "j", "a1", 2, "propagated")]
