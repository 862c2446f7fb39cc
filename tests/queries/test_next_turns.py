"""next_turns: next-turn suggestions from edge utility, on a node_visits fixture worked out by hand."""

from __future__ import annotations

import pyarrow as pa
import pytest

from tracedag.pipeline.analysis.trajectories import _VISITS_SCHEMA
from tracedag.pipeline.store.parquet import write_parquet_atomic
from tracedag.pipeline.store.querying import run_named
from tracedag.schemas.layout import table_dir

# (run, [(turn, node, failed, parallel-with-next)]): agent "a" version "1" unless said otherwise.
RUNS = {
    "R1": [(1, "router", False, False), (1, "ask", False, False), (2, "ask", False, False), (2, "book", True, False)],
    "R2": [(1, "router", False, False), (1, "ask", False, False), (2, "book", False, False)],
    "R3": [(1, "router", False, False), (1, "info", False, False)],
    "R4": [(1, "router", False, False), (1, "ask", False, False), (1, "ask", False, False)],
    "R5": [(1, "router", False, True), (1, "A", False, False)],  # a parallel branch: no transition
}


def _visits():
    rows = []
    for agent, runs in (("a", RUNS), ("b", {"B1": [(1, "router", False, False), (1, "x", False, False)]})):
        for run, visits in runs.items():
            for i, (turn, node, failed, parallel) in enumerate(visits):
                nxt = visits[i + 1] if i + 1 < len(visits) else None
                rows.append({"agent": agent, "agent_version": "1", "run_key": run, "position": i, "turn": turn,
                             "node": node, "failed": failed, "next_node": nxt[1] if nxt else None,
                             "next_failed": nxt[2] if nxt else None, "next_turn": nxt[0] if nxt else None,
                             "allowed": None, "parallel": parallel})
    return pa.Table.from_pylist(rows, schema=_VISITS_SCHEMA)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("next") / "data"
    write_parquet_atomic(_visits(), table_dir(path, "node_visits"))
    return path


def _rows(data, **params):
    cols = ("agent", "state", "rank", "next_node", "probability", "transitions", "conversations", "failures",
            "success_rate", "cross_turn")
    return [tuple(r[c] for c in cols) for r in run_named(data, "next_turns", {k: str(v) for k, v in params.items()})
            .to_pylist()]


def test_every_state_ranked_by_utility(data):
    # router: ask in R1, R2, R4 (3 of 4), info in R3; R5's branch is parallel. ask: ask (R1 across the
    # turn, R4 within it) and book (R1 failed, R2 across the turn) tie at 2: fewer failures first.
    assert _rows(data, top=0) == [
        ("a", "ask", 1, "ask", 0.5, 2, 2, 0, 1.0, 1),
        ("a", "ask", 2, "book", 0.5, 2, 2, 1, 0.5, 1),
        ("a", "router", 1, "ask", 0.75, 3, 3, 0, 1.0, 0),
        ("a", "router", 2, "info", 0.25, 1, 1, 0, 1.0, 0),
        ("b", "router", 1, "x", 1.0, 1, 1, 0, 1.0, 0),
    ]


def test_one_state_into_the_next_user_turn(data):
    # from ask, only R1's ask->ask and R2's ask->book cross into turn 2: a tie broken by name
    assert _rows(data, node="ask", cross_turn_only="true") == [
        ("a", "ask", 1, "ask", 0.5, 1, 1, 0, 1.0, 1),
        ("a", "ask", 2, "book", 0.5, 1, 1, 0, 1.0, 1),
    ]


def test_top_and_agent(data):
    assert [(r[0], r[1], r[3]) for r in _rows(data, top=1)] == [("a", "ask", "ask"), ("a", "router", "ask"),
                                                               ("b", "router", "x")]
    assert [r[3] for r in _rows(data, agent="b")] == ["x"]
