"""Evaluations carried in the spans (the ``evaluations`` table) mapped onto the 1-5 scale.

The mapping, in order:

1. A known verdict label wins: pass-like labels (pass, passed, true, yes, correct, relevant,
   factual, faithful, grounded, good, success, ...) -> 5, fail-like labels (fail, false, no,
   incorrect, irrelevant, hallucinated, unfaithful, bad, error, ...) -> 1, middling labels
   (partial, partially_correct, mixed, neutral, borderline) -> 3.
2. Otherwise the numeric ``score_value``, on a scale chosen per metric name from all of its
   values in the run: every value in [0, 1] -> unit scale, ``1 + 4 v``; all in [1, 5] ->
   passed through; all in [0, 10] -> ``1 + 4 v / 10``; all in [0, 100] -> ``1 + 4 v / 100``.
   (So a metric whose values are all 0 or 1 is read as a 0-1 score: 1 -> 5, 0 -> 1.)
3. Metrics where a higher value is worse (hallucination, toxicity, bias, harm...) are inverted
   after scaling: ``6 - s``.
4. Anything else (no label we know, no score, values outside every scale) is not mapped and is
   counted in the run statistics.

Several results for the same (step, metric) keep the latest one (``time_unix_nano``).
A failing evaluation gets the taxonomy category its metric name suggests (faithfulness ->
unfaithful_output, format/json -> format_violation, ...), else ``unclassified`` with the reason.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from tracedag.pipeline.score.rows import ScoreRow, categorize

PASS_LABELS = frozenset(
    ["pass", "passed", "true", "yes", "correct", "relevant", "factual", "faithful", "grounded", "good", "success", "successful", "ok", "accurate", "valid", "safe", "helpful", "complete", "supported"]
)
FAIL_LABELS = frozenset(
    ["fail", "failed", "false", "no", "incorrect", "irrelevant", "hallucinated", "unfaithful", "ungrounded", "bad", "failure", "error", "wrong", "inaccurate", "invalid", "unsafe", "toxic", "unhelpful", "incomplete", "unsupported", "refused"]
)
MID_LABELS = frozenset(["partial", "partially_correct", "partially_relevant", "mixed", "neutral", "borderline"])

LOWER_IS_BETTER = re.compile(r"hallucinat|toxic|bias|harm|unsafe|error_rate|pii_leak", re.I)

# metric-name keyword -> taxonomy L3 of a failing evaluation, first match wins
METRIC_CATEGORIES: tuple[tuple[str, str], ...] = (
    (r"faithful|hallucinat|grounded|groundedness|factual|consisten", "unfaithful_output"),
    (r"format|json|schema|structure", "format_violation"),
    (r"refus", "refusal"),
    (r"tool_?(?:selection|choice|correctness)", "wrong_tool"),
    (r"argument|parameter", "malformed_arguments"),
    (r"plan|step_?efficiency|completeness", "missing_step"),
    (r"loop|repetit", "repetitive_loop"),
    (r"context_?(?:recall|retention)|memory", "forgotten_fact"),
)

_SCALES: tuple[tuple[float, float, str], ...] = ((0, 1, "unit"), (1, 5, "likert5"), (0, 10, "ten"), (0, 100, "percent"))


@lru_cache(maxsize=4096)
def label_score(label: str | None) -> float | None:
    """The 1-5 score a verdict label stands for, or None when the label is not a known verdict."""
    if not label:
        return None
    key = label.strip().lower().replace(" ", "_").replace("-", "_")
    if key in PASS_LABELS:
        return 5.0
    if key in FAIL_LABELS:
        return 1.0
    return 3.0 if key in MID_LABELS else None


def detect_scale(values: Iterable[float]) -> str | None:
    """The scale of a metric's values: unit, likert5, ten, percent, or None when none fits."""
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    lo, hi = min(vals), max(vals)
    for low, high, name in _SCALES:
        if lo >= low and hi <= high:
            return name
    return None


def scale_value(value: float, scale: str) -> float:
    """Map ``value`` on ``scale`` onto 1-5."""
    if scale == "unit":
        return 1 + 4 * value
    if scale == "ten":
        return 1 + 4 * value / 10
    if scale == "percent":
        return 1 + 4 * value / 100
    return value


def map_one(name: str, value: float | None, label: str | None, scale: str | None) -> float | None:
    """The 1-5 score of one evaluation result, or None when it cannot be mapped."""
    found = label_score(label)
    if found is None and value is not None and scale is not None:
        found = scale_value(value, scale)
    if found is None:
        return None
    return 6 - found if LOWER_IS_BETTER.search(name) and label_score(label) is None else found


@lru_cache(maxsize=4096)
def category_for(metric: str) -> str | None:
    """The taxonomy L3 suggested by an evaluation metric's name, if any."""
    for pattern, l3 in METRIC_CATEGORIES:
        if re.search(pattern, metric, re.I):
            return l3
    return None


@dataclass
class MapStats:
    """Counts of evaluation rows seen, mapped and left out (with the reason)."""

    seen: int = 0
    mapped: int = 0
    unmatched_step: int = 0
    unmappable: int = 0


def _latest(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    best: dict[tuple[str, str, str], dict[str, Any]] = {}
    for r in rows:
        key = (r["trace_id"], r["span_id"], r["name"])
        if key not in best or (r.get("time_unix_nano") or 0) >= (best[key].get("time_unix_nano") or 0):
            best[key] = r
    return list(best.values())


def _explanation(r: dict[str, Any]) -> str:
    kind = r.get("source_kind") or "evaluation"
    who = f"{r['evaluator']} via {kind}" if r.get("evaluator") else kind
    raw = [f"label {r['label']}" if r.get("label") else "",
           f"value {r['score_value']:g}" if r.get("score_value") is not None else ""]
    text = f"{who}: {', '.join(x for x in raw if x)}"
    return f"{text}; {r['explanation']}" if r.get("explanation") else text


def map_evaluations(
    rows: list[dict[str, Any]], builds: dict[tuple[str, str], str], stats: MapStats | None = None,
    ranges: dict[str, tuple[float, float]] | None = None,
) -> list[ScoreRow]:
    """Map ``evaluations`` rows onto score rows for the steps in ``builds`` ((trace, span) -> build_id).

    ``ranges`` gives each metric's (min, max) over the whole table, which decides its scale;
    without it the scale comes from the values in ``rows``.
    """
    stats = stats if stats is not None else MapStats()
    stats.seen += len(rows)
    stats.unmappable += sum(1 for r in rows if not r.get("name"))
    values: dict[str, list[float]] = {name: [lo, hi] for name, (lo, hi) in (ranges or {}).items()}
    if ranges is None:
        for r in rows:
            if r.get("score_value") is not None and r.get("name"):
                values.setdefault(r["name"], []).append(float(r["score_value"]))
    scales = {name: detect_scale(v) for name, v in values.items()}
    out: list[ScoreRow] = []
    for r in _latest(x for x in rows if x.get("name")):
        build = builds.get((r["trace_id"], r["span_id"] or ""))
        if build is None:
            stats.unmatched_step += 1
            continue
        score = map_one(r["name"], r.get("score_value"), r.get("label"), scales.get(r["name"]))
        if score is None:
            stats.unmappable += 1
            continue
        out.append(_row(r, build, score))
    stats.mapped += len(out)
    return out


def _row(r: dict[str, Any], build: str, score: float) -> ScoreRow:
    row = ScoreRow(r["trace_id"], r["span_id"], build, r["name"], round(score, 4), "evaluation",
                   label=r.get("label"), explanation=_explanation(r))
    row.category, reason = categorize(score, category_for(r["name"]),
                                      f"evaluation metric '{r['name']}' names no failure category")
    if reason:
        row.explanation = f"{reason}; {row.explanation}"
    return row
