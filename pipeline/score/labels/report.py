"""Rich tables for ``tracedag labels import`` and ``tracedag labels agreement``."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from tracedag.pipeline.score.labels.agreement import CLASSES, Agreement
from tracedag.pipeline.score.labels.human import ImportResult


def _num(value: float | None, pct: bool = False) -> str:
    if value is None:
        return "n/a"
    return f"{value:.1%}" if pct else f"{value:.3f}"


def import_renderable(result: ImportResult, strict: bool) -> RenderableType:
    """Summary of an import and every bad row with its line number."""
    verb = "imported nothing (--strict)" if strict and result.bad else f"imported {result.imported} labels"
    parts: list[RenderableType] = [Text(
        f"{verb}; {result.duplicates} unchanged duplicates skipped; {len(result.bad)} bad rows; "
        f"{result.not_built} labels on steps not built yet")]
    if result.bad:
        t = Table(title="bad rows (not imported)")
        t.add_column("line", justify="right")
        t.add_column("reason")
        for line, reason in result.bad:
            t.add_row(str(line), reason)
        parts.append(t)
    return Group(*parts)


def summary_table(results: list[Agreement], labelled: int) -> Table:
    """One row per source: pairs, coverage, kappa 1-5, kappa fail/pass, recall, precision."""
    t = Table(title=f"agreement with human labels ({labelled} labelled steps)")
    for name in ("source", "pairs", "coverage", "kappa 1-5", "kappa fail/pass", "failure recall",
                 "failure precision", "kappa area (both failed)"):
        t.add_column(name, justify="left" if name == "source" else "right")
    for a in results:
        cover = a.pairs / labelled if labelled else None
        t.add_row(a.source, str(a.pairs), _num(cover, True), _num(a.kappa), _num(a.kappa_fail),
                  f"{_num(a.recall, True)} ({a.detected}/{a.human_failures})", _num(a.precision, True),
                  f"{_num(a.kappa_category)} ({a.category_pairs})")
    return t


def matrix_table(a: Agreement) -> Table:
    """The 5x5 confusion matrix of one source (rows: human, columns: source)."""
    t = Table(title=f"confusion: {a.source}", caption=f"rows: human, columns: {a.source}")
    t.add_column("score")
    for c in CLASSES:
        t.add_column(str(c), justify="right")
    for c, row in zip(CLASSES, a.matrix, strict=True):
        t.add_row(str(c), *(str(n) for n in row))
    return t


def agreement_renderable(results: list[Agreement], labelled: int) -> RenderableType:
    """The summary table and one confusion matrix per source."""
    if not results:
        return Text(f"no step has both a human label and an automatic score ({labelled} labelled steps)")
    return Group(summary_table(results, labelled), *(matrix_table(a) for a in results))
