"""Rows of the ``step_scores`` table and the conventions every score source shares.

Scale: 1-5, higher is better; a score <= ``FAILED_AT`` (2) means the step failed, and then the
row carries a taxonomy category (never blank: ``unclassified`` with the reason in the
explanation). Labels derived from scores: ``fail`` (<= 2), ``partial`` (< 4), ``pass``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import pyarrow as pa

from tracedag.pipeline.score.taxonomy import Category, load_taxonomy
from tracedag.schemas.tables import STEP_SCORES_V1

FAILED_AT = 2.0
SOURCES = ("rule", "evaluation", "judge", "human")


@dataclass
class ScoreRow:
    """One (step, metric) score from one source."""

    trace_id: str
    span_id: str
    build_id: str | None
    metric: str
    score: float
    source: str
    label: str | None = None
    rule_name: str | None = None
    judge_model: str | None = None
    rubric_version: str | None = None
    explanation: str | None = None
    category: Category | None = field(default=None)

    @property
    def failed(self) -> bool:
        """True when the score marks a failure (<= 2)."""
        return is_failed(self.score)


def is_failed(score: float | None) -> bool:
    """True when ``score`` is on the failing side of the 1-5 scale."""
    return score is not None and score <= FAILED_AT


def label_for(score: float) -> str:
    """The label derived from a 1-5 score: fail, partial or pass."""
    if is_failed(score):
        return "fail"
    return "partial" if score < 4 else "pass"


def categorize(score: float, l3: str | None, reason: str) -> tuple[Category | None, str | None]:
    """Return the category of a row and, when unclassified, the reason to add to its explanation."""
    if not is_failed(score):
        return None, None
    found = load_taxonomy().classify(l3)
    if found is not None:
        return found, None
    return load_taxonomy().unclassified(), f"unclassified: {reason}"


def _values(r: ScoreRow) -> tuple[object, ...]:
    cat = r.category
    return (r.trace_id, r.span_id, r.build_id, r.metric, float(r.score), r.label or label_for(r.score), r.source,
            r.rule_name, r.judge_model, r.rubric_version, r.explanation,
            cat.l1 if cat else None, cat.l2 if cat else None, cat.l3 if cat else None)


def to_table(rows: Iterable[ScoreRow], scored_unix_nano: int | None = None) -> pa.Table:
    """Build a ``STEP_SCORES_V1`` table from ``rows``."""
    now = scored_unix_nano or time.time_ns()
    columns = list(zip(*(_values(r) for r in rows), strict=True)) or [()] * 14
    arrays = [pa.array(col, type=f.type) for col, f in zip(columns, STEP_SCORES_V1, strict=False)]
    arrays.append(pa.array([now] * len(arrays[0]), type=pa.int64()))
    return pa.Table.from_arrays(arrays, schema=STEP_SCORES_V1)


def passing_table(keys: pa.Table, rule_name: str, explanation: str, score: float,
                  scored_unix_nano: int | None = None) -> pa.Table:
    """``STEP_SCORES_V1`` rows of source rule for ``keys`` (trace_id, span_id, build_id, metric), all passing."""
    n = keys.num_rows
    now = scored_unix_nano or time.time_ns()
    given = {name: keys.column(name) for name in ("trace_id", "span_id", "build_id", "metric")}
    consts: dict[str, object] = {"score": float(score), "label": label_for(score), "source": "rule",
                                 "rule_name": rule_name, "explanation": explanation, "scored_unix_nano": now}
    arrays = []
    for f in STEP_SCORES_V1:
        if f.name in given:
            arrays.append(given[f.name].cast(f.type))
        elif f.name in consts:
            arrays.append(pa.repeat(pa.scalar(consts[f.name], type=f.type), n))
        else:
            arrays.append(pa.nulls(n, f.type))
    return pa.Table.from_arrays(arrays, schema=STEP_SCORES_V1)
