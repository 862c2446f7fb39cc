"""A workflow score exactly at the pass threshold passes, in workflow_scores and trace_summary alike.

The weighted harmonic mean sum(w) / sum(w / s) used to sum the doubles w / s: for eleven steps
scored 3 (weight 1 each) that sum is 3.0000000000000004 (1/3 is no double), so the score came out
2.9999999999999996 and the trace failed a threshold of 3. Worse, the sum's value depended on the
order DuckDB's parallel aggregate added the rows in: under a live collector the same SQL gave
``passed`` true in one run and false in the next for a trace whose mean is exactly 3, so the stored
rows of a materialize round and the SQL over the same store disagreed (seen on 5 of 26k traces).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.queries.query_fixtures import Score, Step, Trace, write_store
from tracedag.pipeline.score.materialize import materialize
from tracedag.pipeline.store.querying import run_named


def _flat_trace(trace_id: str, steps: int, offset_ms: int) -> Trace:
    """A flat-fallback trace (every weight 1) of ``steps`` steps, each scored 3: its mean is 3 exactly."""
    spans = [Step(f"{trace_id}-{i}", None if i == 0 else f"{trace_id}-0", f"step{i}", i, i + 1) for i in range(steps)]
    return Trace(trace_id, offset_ms, spans, scores=[Score(s.span_id, 3.0) for s in spans], flat=True)


SIZES = (3, 11, 33, 47)
"""Step counts whose sum of the double 1/3 exceeds n/3 (11, 33, 47) and one whose sum is exact (3)."""


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return write_store(tmp_path / "data", [_flat_trace(f"t{n}", n, 1000 * n) for n in SIZES])


@pytest.mark.parametrize("name", ["workflow_scores", "trace_summary"])
def test_a_mean_exactly_at_the_threshold_passes(store: Path, name: str) -> None:
    got = {r["trace_id"]: (r["workflow_score"], r["passed"]) for r in run_named(store, name).to_pylist()}
    assert {t: p for t, (_, p) in got.items()} == {f"t{n}": True for n in SIZES}
    assert all(s == pytest.approx(3.0, abs=1e-12) and s >= 3.0 for s, _ in got.values())


def test_the_stored_rows_agree(store: Path) -> None:
    assert materialize(store, []).full
    for name in ("workflow_scores", "trace_summary"):
        assert {r["passed"] for r in run_named(store, name).to_pylist()} == {True}
