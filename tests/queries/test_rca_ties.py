"""Ties on score go to the deepest failing step on the chain, in every strategy (issue #30 class 6).

The hand-built trace (worked out by hand): agent ``r`` runs node ``check_availability`` (``w``,
10-40 ms), whose tool ``calendar_search`` (``t``, 15-30 ms) fails; the node fails because of it,
and ``finalize`` (``f``, 45-50 ms, after ``w``) fails on the node's missing result. All three score
1.0. Failure DAG: t -> w (a child feeds its parent) -> f. The final failure is ``f``; the failures
upstream of it are ``w`` (1 hop) and ``t`` (2 hops), equal on score. ``w`` starts before ``t`` (a
parent always starts before its child), so a tie broken by the earliest start named the wrapper;
the deepest step in the call tree is the tool that failed under it.

A second trace keeps the earliest start among steps of one depth: ``x`` and ``y`` (siblings, both
1.0) feed ``k``; ``x`` starts first and is named.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.queries.query_fixtures import Score, Step, Trace, write_store
from tracedag.pipeline.store.querying import run_named

STRATEGIES = ("greedy", "full_path_min", "weighted", "agenteval")

WRAPPED = Trace(
    "t-wrapped", 0,
    [Step("r", None, "booking_agent", 0, 60, "agent"),
     Step("w", "r", "check_availability", 10, 40, "chain"),
     Step("t", "w", "calendar_search", 15, 30, "tool"),
     Step("f", "r", "finalize", 45, 50, "chain")],
    sequence=[("w", "f")],
    scores=[Score("t", 1.0, taxonomy_l1="tool_execution"), Score("w", 1.0, taxonomy_l1="tool_execution"),
            Score("f", 1.0, taxonomy_l1="generation")],
)

SIBLINGS = Trace(
    "t-siblings", 1000,
    [Step("r2", None, "router", 0, 50, "agent"), Step("x", "r2", "lookup_x", 10, 20),
     Step("y", "r2", "lookup_y", 12, 22), Step("k", "r2", "combine", 25, 30, "chain")],
    sequence=[("x", "k"), ("y", "k")],
    scores=[Score("x", 1.0), Score("y", 1.0), Score("k", 1.0)],
)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_store(tmp_path_factory.mktemp("ties"), [WRAPPED, SIBLINGS])


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_tool_that_failed_under_the_wrapper_is_the_root(store: Path, strategy: str) -> None:
    got = run_named(store, "root_causes", {"trace_id": "t-wrapped", "strategy": strategy}).to_pylist()
    assert [(r["failed_span_id"], r["root_span_id"], r["root_step_name"]) for r in got] == [
        ("f", "t", "calendar_search")]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_per_step_the_wrapper_itself_is_caused_by_its_tool(store: Path, strategy: str) -> None:
    got = run_named(store, "root_causes", {"trace_id": "t-wrapped", "strategy": strategy, "per": "step"})
    assert {r["failed_span_id"]: r["root_span_id"] for r in got.to_pylist()} == {"t": "t", "w": "t", "f": "t"}


@pytest.mark.parametrize("strategy", ("greedy", "full_path_min", "weighted"))
def test_siblings_of_one_depth_still_tie_on_the_earliest_start(store: Path, strategy: str) -> None:
    got = run_named(store, "root_causes", {"trace_id": "t-siblings", "strategy": strategy}).to_pylist()
    assert [(r["failed_span_id"], r["root_span_id"]) for r in got] == [("k", "x")]
