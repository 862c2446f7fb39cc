"""failures, propagation, root_causes and amplification on the hand-built fixture store.

Every expected row below was worked out by hand from the traces in conftest.py.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from tracedag.pipeline.store.querying import run_named
from tracedag.pipeline.store.views import connect
from tracedag.queries import load


def rows(query_store: Path, name: str, **params: str) -> list[dict[str, object]]:
    return run_named(query_store, name, params).to_pylist()


def pick(result: list[dict[str, object]], *cols: str) -> list[tuple[object, ...]]:
    return [tuple(r[c] for c in cols) for r in result]


def by_step(result: list[dict[str, object]], *cols: str) -> dict[str, tuple[object, ...]]:
    return {str(r["span_id"]): tuple(r[c] for c in cols) for r in result}


def test_failures_lists_every_failed_step_with_aggregated_score(query_store: Path) -> None:
    got = pick(rows(query_store, "failures"), "trace_id", "span_id", "score", "source", "taxonomy_l1", "recovered")
    assert got == [
        ("t1-chain", "r", 2.0, "judge", "planning", False),
        ("t1-chain", "s1", 1.0, "rule", "tool_execution", False),
        ("t1-chain", "s2", 2.0, "rule", "generation", False),
        ("t1-chain", "s3", 2.0, "rule", "generation", False),
        ("t1-chain", "s4", 1.5, "rule", "generation", False),
        ("t2-converge", "a1", 2.0, "rule", "tool_execution", False),
        ("t2-converge", "b1", 1.5, "rule", "tool_execution", False),
        ("t2-converge", "a2", 1.0, "rule", "parameter", False),
        ("t2-converge", "b2", 2.0, "rule", "parameter", False),
        ("t2-converge", "j", 1.0, "rule", "generation", False),
        # the failed call_api #1 was fixed by its retry; c2 (min of 5 and 4) did not fail
        ("t3-retry", "c1", 1.0, "rule", "tool_execution", True),
        ("t3-retry", "m", 2.0, "judge", "generation", False),
        # x: the human 1.0 overrides the judge 4.0; z: the human 4.0 overrides the judge 1.0
        ("t4-ties", "x", 1.0, "human", "context_loss", False),
        ("t4-ties", "y", 1.0, "judge", "tool_selection", False),
        ("t4-ties", "k", 2.0, "rule", "planning", False),
        ("t6-flat", "f1", 1.0, "rule", "infrastructure", False),
        ("t6-flat", "f2", 2.0, "rule", None, False),
    ]


def test_failures_carry_conversation_and_time(query_store: Path) -> None:
    first = rows(query_store, "failures", trace_id="t3-retry")[0]
    assert (first["conversation_id"], first["taxonomy_l2"], first["duration_ms"]) == ("c2", "rate_limit", 10.0)
    assert str(first["start_time"]) == "2023-11-14 22:13:22.010000"


def test_fail_threshold_is_a_parameter(query_store: Path) -> None:
    # at threshold 1.0 only the steps scored 1.0 fail
    got = {(r["trace_id"], r["span_id"]) for r in rows(query_store, "failures", fail_threshold="1.0")}
    assert got == {("t1-chain", "s1"), ("t2-converge", "a2"), ("t2-converge", "j"), ("t3-retry", "c1"),
                   ("t4-ties", "x"), ("t4-ties", "y"), ("t6-flat", "f1")}


def test_linear_chain_one_root_rest_propagated_longest_chains(query_store: Path) -> None:
    got = by_step(rows(query_store, "propagation", trace_id="t1-chain"),
                  "kind", "nearest_failing_upstream", "failing_upstream", "longest_chain")
    assert got == {
        "s1": ("originating", [], [], 0),
        "s2": ("propagated", ["s1"], ["s1"], 1),
        "s3": ("propagated", ["s2"], ["s1", "s2"], 2),
        "s4": ("propagated", ["s3"], ["s1", "s2", "s3"], 3),
        # the parent depends on every child; the longest failure chain to it is s1-s2-s3-s4-r
        "r": ("propagated", ["s1", "s2", "s3", "s4"], ["s1", "s2", "s3", "s4"], 4),
    }


def test_two_failing_branches_converge_in_a_join(query_store: Path) -> None:
    got = by_step(rows(query_store, "propagation", trace_id="t2-converge"),
                  "kind", "nearest_failing_upstream", "failing_upstream", "longest_chain")
    assert got == {
        "a1": ("originating", [], [], 0),
        "b1": ("originating", [], [], 0),
        "a2": ("propagated", ["a1"], ["a1"], 1),
        "b2": ("propagated", ["b1"], ["b1"], 1),
        "j": ("propagated", ["a2", "b2"], ["a1", "b1", "a2", "b2"], 2),
    }


def test_failure_recovered_by_retry_does_not_propagate(query_store: Path) -> None:
    # m is downstream of c1 (c1 -> c2 -> m) but c1 was recovered by c2, so m originates
    got = by_step(rows(query_store, "propagation", trace_id="t3-retry"), "kind", "recovered", "failing_upstream")
    assert got == {"c1": ("originating", True, []), "m": ("originating", False, [])}


def test_flat_trace_failures_are_all_originating(query_store: Path) -> None:
    got = by_step(rows(query_store, "propagation", trace_id="t6-flat"), "kind", "longest_chain")
    assert got == {"f1": ("originating", 0), "f2": ("originating", 0)}


def test_trace_without_failures_has_no_rows(query_store: Path) -> None:
    for name in ("failures", "propagation", "root_causes"):
        assert rows(query_store, name, trace_id="t5-clean") == []


ROOT_COLS = ("trace_id", "failed_span_id", "root_span_id", "root_score", "hops_from_root")


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        # j's failing predecessors are a2 (1.0) and b2 (2.0): greedy takes a2, then a2's only one, a1.
        ("greedy", ("t2-converge", "j", "a1", 2.0, 2)),
        # the lowest score anywhere upstream of j: a2 (1.0, earlier than j... and than nothing else at 1.0)
        ("full_path_min", ("t2-converge", "j", "a2", 1.0, 1)),
        # originating candidates a1: (5-2)*(1+2)=9, b1: (5-1.5)*(1+2)=10.5 -> b1
        ("weighted", ("t2-converge", "j", "b1", 1.5, 2)),
    ],
)
def test_the_three_strategies_differ_on_the_convergence_trace(
    query_store: Path, strategy: str, expected: tuple[object, ...]
) -> None:
    got = pick(rows(query_store, "root_causes", trace_id="t2-converge", strategy=strategy), *ROOT_COLS)
    assert got == [expected]


def test_root_causes_per_trace_greedy(query_store: Path) -> None:
    got = pick(rows(query_store, "root_causes"), *ROOT_COLS, "kind", "failed_steps_in_trace")
    assert got == [
        # r's failing predecessors s1 (1.0), s2, s3 (2.0), s4 (1.5): lowest is s1, one hop
        ("t1-chain", "r", "s1", 1.0, 1, "propagated", 5),
        ("t2-converge", "j", "a1", 2.0, 2, "propagated", 5),
        # the only unrecovered failure is m, its own root
        ("t3-retry", "m", "m", 2.0, 0, "originating", 2),
        # tie: x and y both 1.0 -> x, which starts first
        ("t4-ties", "k", "x", 1.0, 1, "propagated", 3),
        # flat: two independent failures, none upstream of the other -> the one ending last
        ("t6-flat", "f2", "f2", 2.0, 0, "originating", 2),
    ]


def test_root_causes_per_step_follow_the_chain(query_store: Path) -> None:
    got = by_step([dict(r, span_id=r["failed_span_id"]) for r in
                   rows(query_store, "root_causes", trace_id="t1-chain", per="step")], "root_span_id", "hops_from_root")
    assert got == {"r": ("s1", 1), "s1": ("s1", 0), "s2": ("s1", 1), "s3": ("s1", 2), "s4": ("s1", 3)}


def test_root_causes_per_step_full_path_min_on_chain_uses_longest_path_hops(query_store: Path) -> None:
    got = {r["failed_span_id"]: (r["root_span_id"], r["hops_from_root"]) for r in
           rows(query_store, "root_causes", trace_id="t1-chain", per="step", strategy="full_path_min")}
    assert got == {"r": ("s1", 4), "s1": ("s1", 0), "s2": ("s1", 1), "s3": ("s1", 2), "s4": ("s1", 3)}


def test_hops_from_root_and_longest_chain_are_named_apart_and_longest_chain_agrees(query_store: Path) -> None:
    # r (t1): greedy moves once, to s1 (its lowest failing predecessor), but the longest chain to r is
    # s1-s2-s3-s4-r; j (t2): full_path_min stops at a2 (1.0), one hop, on the chain a1-a2-j
    greedy = {r["failed_span_id"]: (r["root_span_id"], r["hops_from_root"], r["longest_chain"])
              for r in rows(query_store, "root_causes", trace_id="t1-chain", per="step")}
    assert greedy == {"r": ("s1", 1, 4), "s1": ("s1", 0, 0), "s2": ("s1", 1, 1), "s3": ("s1", 2, 2),
                      "s4": ("s1", 3, 3)}
    fpm = pick(rows(query_store, "root_causes", trace_id="t2-converge", strategy="full_path_min"),
               "failed_span_id", "root_span_id", "hops_from_root", "longest_chain")
    assert fpm == [("j", "a2", 1, 2)]
    chains = {(r["trace_id"], r["span_id"]): r["longest_chain"] for r in rows(query_store, "propagation")}
    for strategy in ("greedy", "full_path_min", "weighted", "agenteval"):
        for r in rows(query_store, "root_causes", per="step", strategy=strategy):
            assert r["longest_chain"] == chains[(r["trace_id"], r["failed_span_id"])], (strategy, r)
            if strategy != "agenteval":
                assert r["hops_from_root"] <= r["longest_chain"], (strategy, r)


def test_ties_resolved_by_earliest_start_in_every_strategy(query_store: Path) -> None:
    for strategy in ("greedy", "full_path_min", "weighted"):
        got = pick(rows(query_store, "root_causes", trace_id="t4-ties", strategy=strategy), "root_span_id")
        assert got == [("x",)], strategy


def test_recovered_failure_is_its_own_root_per_step(query_store: Path) -> None:
    got = {r["failed_span_id"]: (r["root_span_id"], r["recovered"]) for r in
           rows(query_store, "root_causes", trace_id="t3-retry", per="step")}
    assert got == {"c1": ("c1", True), "m": ("m", False)}


def test_sql_guards_the_strategy_when_run_directly(query_store: Path) -> None:
    con = connect(query_store)
    params = {"fail_threshold": 2.0, "since_ns": 0, "trace_id": "", "strategy": "bogus", "per": "trace",
              "max_hops": 1000}
    with pytest.raises(duckdb.Error, match="strategy must be"):
        con.execute(load("root_causes"), params).fetchall()


def test_amplification_per_category(query_store: Path) -> None:
    got = pick(rows(query_store, "amplification"), "category", "failures", "originating", "propagated", "recovered",
               "propagated_share", "downstream_failures", "amplification_factor")
    assert got == [
        # s1 reaches s2, s3, s4, r; a1 reaches a2, j; b1 reaches b2, j; c1 was recovered: (4+2+2)/3
        ("tool_execution", 4, 3, 0, 1, 0.0, 8, pytest.approx(8 / 3)),
        ("context_loss", 1, 1, 0, 0, 0.0, 1, 1.0),  # x -> k
        ("tool_selection", 1, 1, 0, 0, 0.0, 1, 1.0),  # y -> k
        ("generation", 5, 1, 4, 0, 0.8, 0, 0.0),  # s2, s3, s4, j propagated; m originates, reaches none
        ("parameter", 2, 0, 2, 0, 1.0, 0, None),
        ("planning", 2, 0, 2, 0, 1.0, 0, None),
        ("infrastructure", 1, 1, 0, 0, 0.0, 0, 0.0),
        ("unclassified", 1, 1, 0, 0, 0.0, 0, 0.0),  # f2 has no taxonomy
    ]


def test_amplification_level_two(query_store: Path) -> None:
    got = {r["category"]: r["failures"] for r in rows(query_store, "amplification", level="2")}
    assert got == {"rate_limit": 1, "unfaithful": 1, "unclassified": 15}
