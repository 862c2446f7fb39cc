"""Agreement of each automatic source with the human labels: Cohen's kappa, confusion, recall.

Pairs come from ``queries/score_agreement_pairs.sql``. Scores are put in the five categories
1-5 by rounding half up (3.5 -> 4); ``kappa_fail`` is Cohen's kappa on the two classes
failed (<= 2) / not failed; recall is the share of human-failed steps the source also fails,
precision the share of the source's failures the humans agree with. ``kappa_category`` compares
the failure areas (taxonomy L1) on the steps that both failed and both categorised.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tracedag.pipeline.score.rows import is_failed
from tracedag.pipeline.score.taxonomy import UNCLASSIFIED, load_taxonomy
from tracedag.pipeline.store.views import connect
from tracedag.queries import load

CLASSES = (1, 2, 3, 4, 5)


def to_class(score: float) -> int:
    """The 1-5 category of a score (round half up, clamped)."""
    return min(5, max(1, math.floor(score + 0.5)))


def cohen_kappa(a: Sequence[Hashable], b: Sequence[Hashable]) -> float | None:
    """Cohen's kappa of two raters over the same items; None when undefined (chance agreement 1)."""
    if len(a) != len(b):
        raise ValueError("raters must rate the same items")
    n = len(a)
    if n == 0:
        return None
    observed = sum(1 for x, y in zip(a, b, strict=True) if x == y) / n
    ca, cb = Counter(a), Counter(b)
    expected = sum(ca[k] * cb[k] for k in ca) / (n * n)
    if expected >= 1.0:
        return None
    return (observed - expected) / (1 - expected)


def confusion(human: Sequence[int], source: Sequence[int]) -> list[list[int]]:
    """5x5 counts: rows = human class 1..5, columns = source class 1..5."""
    m = [[0] * 5 for _ in CLASSES]
    for h, s in zip(human, source, strict=True):
        m[h - 1][s - 1] += 1
    return m


@dataclass(frozen=True)
class Agreement:
    """Agreement of one source with the human labels."""

    source: str
    pairs: int
    kappa: float | None
    kappa_fail: float | None
    human_failures: int
    detected: int
    source_failures: int
    matrix: list[list[int]]
    kappa_category: float | None = None
    category_pairs: int = 0

    @property
    def recall(self) -> float | None:
        """Share of human-failed steps the source also failed."""
        return self.detected / self.human_failures if self.human_failures else None

    @property
    def precision(self) -> float | None:
        """Share of the source's failures that the humans also failed."""
        return self.detected / self.source_failures if self.source_failures else None


def agreement(source: str, human: Sequence[float], auto: Sequence[float],
              categories: Sequence[tuple[str | None, str | None]] = ()) -> Agreement:
    """Compare one source's scores (and failure areas, as (human L1, source L1)) with the humans'."""
    hc, ac = [to_class(x) for x in human], [to_class(x) for x in auto]
    hf, af = [is_failed(x) for x in human], [is_failed(x) for x in auto]
    both = [(h, a) for h, a in categories if h and a]
    return Agreement(
        source=source, pairs=len(hc), kappa=cohen_kappa(hc, ac), kappa_fail=cohen_kappa(hf, af),
        human_failures=sum(hf), detected=sum(1 for h, a in zip(hf, af, strict=True) if h and a),
        source_failures=sum(af), matrix=confusion(hc, ac),
        kappa_category=cohen_kappa([h for h, _ in both], [a for _, a in both]), category_pairs=len(both),
    )


def _l1(l3: str | None) -> str | None:
    if l3 == UNCLASSIFIED:
        return str(UNCLASSIFIED)
    found = load_taxonomy().classify(l3)
    l1: str | None = found.l1 if found else None
    return l1


def agreement_report(data: Path, metric: str | None = None) -> tuple[list[Agreement], int]:
    """Agreement of every source with the human labels, and the number of human-labelled steps."""
    con = connect(data, shared_macros=False)  # score_agreement_pairs calls no shared query macro
    try:
        pairs = con.execute(load("score_agreement_pairs"), {"metric": metric}).fetchall()
        labelled = con.execute(
            "select count(distinct (trace_id, span_id)) from human_labels "
            "where cast($metric as varchar) is null or metric = cast($metric as varchar)", {"metric": metric}
        ).fetchall()
    finally:
        con.close()
    by_source: dict[str, tuple[list[float], list[float], list[tuple[str | None, str | None]]]] = {}
    for source, _t, _s, h, a, h_l3, a_l1 in pairs:
        hs, as_, cats = by_source.setdefault(source, ([], [], []))
        hs.append(h)
        as_.append(a)
        if is_failed(h) and is_failed(a):
            cats.append((_l1(h_l3), a_l1))
    return [agreement(s, *by_source[s]) for s in sorted(by_source)], int(labelled[0][0])
