"""Downstream step scores of a counterfactual check: the source's steps after the root against the runs'.

The steps compared are those of the source conversation that started at or after the root step (the
root itself and steps with its name left out), by step name; a run's downstream score is the mean
score (``step_scores``: a step's minimum over its rows, a human label first, as ``failures.sql``) of its
steps with those names that were not served from the recording. A run **improved** when its mean
rose by :data:`SCORE_THRESHOLD` or more over the source's.

The threshold is 0.30 on the 1-5 step-score scale: the ``step_score`` fail level of the regression
gate (``regress.model.FAMILIES``), which follows AgentEval's §3.4 comparison of step scores. The
runs' scores exist once their traces are built and scored (:func:`score_runs`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from tracedag.instrument.recorded import RECORDED_ATTRIBUTE

SCORE_THRESHOLD = 0.30
"""The rise of the mean downstream step score that counts as improved (AgentEval §3.4 step_score level)."""

_STEP_SCORE = """
select trace_id, span_id, coalesce(min(score) filter (where source = 'human'), min(score))::double as score
from step_scores group by all
"""

SOURCE_SCORES_SQL = f"""
select s.step_name, sc.score
from spans s join ({_STEP_SCORE}) sc using (trace_id, span_id)
where coalesce(s.conversation_id, s.trace_id) = $cid and s.start_time_unix_nano >= $root_start
  and s.span_id != $root_span and s.step_name is not null and s.step_name != $root_name
"""

RUN_SCORES_SQL = f"""
select coalesce(s.conversation_id, s.trace_id) as run_id, avg(sc.score)::double as score
from spans s join ({_STEP_SCORE}) sc using (trace_id, span_id)
where coalesce(s.conversation_id, s.trace_id) in (select unnest($ids)) and s.step_name in (select unnest($names))
  and coalesce(s.attributes['{RECORDED_ATTRIBUTE}'], 'false') != 'true'
group by all
"""


@dataclass(frozen=True)
class Downstream:
    """The source's downstream mean score and each scored run's (runs without scored steps left out)."""

    before: float | None
    runs: dict[str, float]

    def improved(self, run_id: str) -> bool:
        """True when the run's downstream mean rose by the threshold or more."""
        after = self.runs.get(run_id)
        return self.before is not None and after is not None and after - self.before >= SCORE_THRESHOLD - 1e-9

    def after(self, run_ids: Sequence[str]) -> float | None:
        """The mean over ``run_ids`` of their downstream score (None when none was scored)."""
        scored = [self.runs[r] for r in run_ids if r in self.runs]
        return sum(scored) / len(scored) if scored else None


def downstream_scores(con: duckdb.DuckDBPyConnection, runs_con: duckdb.DuckDBPyConnection, conversation_id: str,
                      root_span_id: str, root_step_name: str, root_start_ns: int, run_ids: Sequence[str]) -> Downstream:
    """The source's downstream steps' mean score in the store of ``con`` and the runs' in that of ``runs_con``
    (the same connection when the runs are stored with the sources)."""
    rows = con.execute(SOURCE_SCORES_SQL, {"cid": conversation_id, "root_start": root_start_ns,
                                           "root_span": root_span_id, "root_name": root_step_name}).fetchall()
    names = sorted({str(r[0]) for r in rows})
    if not rows or not run_ids:
        return Downstream(_mean([r[1] for r in rows]), {})
    return Downstream(_mean([r[1] for r in rows]), _run_scores(runs_con, list(run_ids), names))


def _mean(values: Sequence[Any]) -> float | None:
    scored = [float(v) for v in values if v is not None]
    return sum(scored) / len(scored) if scored else None


def _run_scores(runs_con: duckdb.DuckDBPyConnection, run_ids: list[str], names: list[str]) -> dict[str, float]:
    rows = runs_con.execute(RUN_SCORES_SQL, {"ids": run_ids, "names": names}).fetchall()
    return {str(r[0]): float(r[1]) for r in rows if r[1] is not None}


def score_runs(runs_data: Path) -> None:
    """Build and score (rules and evaluations, no judge) the traces of the runs stored in ``runs_data``."""
    from tracedag.pipeline.dag import build_store
    from tracedag.pipeline.score import score_store

    build_store(runs_data, idle_seconds=0)
    score_store(runs_data)
