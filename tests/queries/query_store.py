"""Fixture store for the query tests: six hand-built traces, each covering one case."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.queries.query_fixtures import Score, Step, Trace, write_store

# T1 chain: s1 -> s2 -> s3 -> s4 under agent r; every step fails, s1 first.
CHAIN = Trace(
    "t1-chain", 0,
    [Step("r", None, "planner", 0, 100, "agent"), Step("s1", "r", "search", 10, 20),
     Step("s2", "r", "parse", 21, 30, "chain"), Step("s3", "r", "answer", 31, 40, "llm", model="gpt-4o",
                                                     input_tokens=1000, output_tokens=200),
     Step("s4", "r", "format", 41, 50, "chain")],
    sequence=[("s1", "s2"), ("s2", "s3"), ("s3", "s4")],
    scores=[Score("s1", 1.0, taxonomy_l1="tool_execution"), Score("s2", 2.0, taxonomy_l1="generation"),
            Score("s3", 2.0, taxonomy_l1="generation"), Score("s4", 1.5, taxonomy_l1="generation"),
            Score("r", 2.0, source="judge", taxonomy_l1="planning")],
    conversation_id="c1",
)

# T2 convergence: branch A (a1 -> a2) and branch B (b1 -> b2) join in j; all five fail, root unscored.
CONVERGE = Trace(
    "t2-converge", 1000,
    [Step("r2", None, "orchestrator", 0, 50, "agent"), Step("a1", "r2", "fetch_a", 10, 20),
     Step("b1", "r2", "fetch_b", 11, 21), Step("a2", "r2", "clean_a", 22, 30, "chain"),
     Step("b2", "r2", "clean_b", 23, 31, "chain"),
     Step("j", "r2", "merge", 32, 40, "llm", model="gpt-4o-mini", input_tokens=2000, output_tokens=1000)],
    sequence=[("a1", "a2"), ("b1", "b2"), ("a2", "j"), ("b2", "j")],
    scores=[Score("a1", 2.0, taxonomy_l1="tool_execution"), Score("a2", 1.0, taxonomy_l1="parameter"),
            Score("b1", 1.5, taxonomy_l1="tool_execution"), Score("b2", 2.0, taxonomy_l1="parameter"),
            Score("j", 1.0, taxonomy_l1="generation")],
    conversation_id="c1",
)

# T3 retry: call_api #1 fails (rate limit), #2 succeeds, then summarize fails on its own.
RETRY = Trace(
    "t3-retry", 2000,
    [Step("r3", None, "assistant", 0, 60, "agent"),
     Step("c1", "r3", "call_api", 10, 20, step_key="tool:call_api", iteration=1),
     Step("c2", "r3", "call_api", 21, 30, step_key="tool:call_api", iteration=2, is_retry=True),
     Step("m", "r3", "summarize", 31, 40, "llm")],
    sequence=[("c1", "c2"), ("c2", "m")],
    scores=[Score("r3", 4.0, source="judge"), Score("c1", 1.0, taxonomy_l1="tool_execution",
                                                     taxonomy_l2="rate_limit"),
            Score("c2", 5.0, metric="status"), Score("c2", 4.0, source="judge"),
            Score("m", 2.0, source="judge", taxonomy_l1="generation", taxonomy_l2="unfaithful")],
    conversation_id="c2",
)

# T4 ties: x and y both score 1.0 and both feed k; x starts first. Human labels override:
# x's judge 4.0 is overridden by the human 1.0, z's judge 1.0 by the human 4.0.
TIES = Trace(
    "t4-ties", 3000,
    [Step("r4", None, "router", 0, 50, "agent"), Step("x", "r4", "lookup_x", 10, 20),
     Step("y", "r4", "lookup_y", 12, 22), Step("k", "r4", "combine", 25, 30, "chain"),
     Step("z", "r4", "reply", 31, 35, "llm")],
    sequence=[("x", "k"), ("y", "k"), ("k", "z")],
    scores=[Score("x", 4.0, source="judge"), Score("x", 1.0, source="human", taxonomy_l1="context_loss"),
            Score("y", 1.0, source="judge", taxonomy_l1="tool_selection"),
            Score("y", 5.0, metric="status"),
            Score("k", 2.0, taxonomy_l1="planning"),
            Score("z", 1.0, source="judge", taxonomy_l1="generation"), Score("z", 4.0, source="human")],
)

# T5 no failures.
CLEAN = Trace(
    "t5-clean", 4000,
    [Step("r5", None, "assistant", 0, 30, "agent"),
     Step("q", "r5", "answer", 5, 25, "llm", model="gpt-4o", input_tokens=500, output_tokens=100)],
    scores=[Score("r5", 5.0), Score("q", 4.0, source="judge")],
    conversation_id="c2",
)

# T6 flat fallback: no edges, no nested set; two independent failures.
FLAT = Trace(
    "t6-flat", 5000,
    [Step("f0", None, "session", 0, 40, "agent"), Step("f1", "f0", "step_one", 5, 15),
     Step("f2", "f0", "step_two", 20, 30)],
    scores=[Score("f1", 1.0, taxonomy_l1="infrastructure"), Score("f2", 2.0)],
    method="flat", flat=True,
)

ALL = [CHAIN, CONVERGE, RETRY, TIES, CLEAN, FLAT]


@pytest.fixture(scope="session")
def query_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data directory holding the six fixture traces."""
    return write_store(tmp_path_factory.mktemp("qstore"), ALL)
