"""Human labels: import from CSV/Parquet, and their mirror as ``source = 'human'`` step scores.

A label file has columns ``trace_id, span_id, metric`` and ``score`` (1-5) or ``label`` (a verdict
such as pass/fail, mapped like evaluation labels), optionally ``taxonomy_l3``, ``annotator`` and
``note``. Every bad row is reported with its line number (CSV: the file line, header = line 1;
Parquet: the row number from 1), never silently dropped. Imports append to ``human_labels``; the
step-score mirror (``tables/step_scores/human.parquet``, ``build_id`` null) is rewritten from all
labels after each import: one row per (step, metric), the mean over annotators' latest labels.
"""

from __future__ import annotations

import csv
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tracedag.pipeline.score.evaluations import label_score
from tracedag.pipeline.score.rows import ScoreRow, categorize, to_table
from tracedag.pipeline.score.taxonomy import UNCLASSIFIED, load_taxonomy
from tracedag.pipeline.score.writes import score_lock
from tracedag.pipeline.store.parquet import write_parquet_atomic
from tracedag.pipeline.store.views import connect
from tracedag.schemas.errors import TracedagError
from tracedag.schemas.layout import table_dir
from tracedag.schemas.tables import HUMAN_LABELS_V1

REQUIRED = ("trace_id", "span_id", "metric")
HUMAN_FILE_STEM = "human"


class BadLabelFile(TracedagError):  # type: ignore[misc, unused-ignore]
    """A label file that cannot be read at all (format, missing columns)."""


@dataclass
class ImportResult:
    """What a label import did: rows imported, duplicates skipped, bad rows with line numbers."""

    imported: int = 0
    duplicates: int = 0
    bad: list[tuple[int, str]] = field(default_factory=list)
    not_built: int = 0
    path: Path | None = None


def read_rows(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(line number, row) pairs of a CSV or Parquet label file."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        table = pq.read_table(path)
        _check_columns(path, table.column_names)
        return [(i + 1, r) for i, r in enumerate(table.to_pylist())]
    if suffix != ".csv":
        raise BadLabelFile(f"{path}: expected a .csv or .parquet file")
    out = []
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        _check_columns(path, list(reader.fieldnames or []))
        for row in reader:
            out.append((reader.line_num, dict(row)))
    return out


def _check_columns(path: Path, columns: list[str]) -> None:
    missing = [c for c in REQUIRED if c not in columns]
    if missing or not {"score", "label"} & set(columns):
        need = missing + ([] if {"score", "label"} & set(columns) else ["score or label"])
        raise BadLabelFile(f"{path}: missing columns {', '.join(need)}")


def _text(value: Any) -> str | None:
    if value is None:
        return None
    text = str(value).strip()
    return text or None


def _score(row: dict[str, Any]) -> float:
    raw, label = _text(row.get("score")), _text(row.get("label"))
    if raw is not None:
        try:
            value: float = float(raw)
        except ValueError:
            raise ValueError(f"score {raw!r} is not a number") from None
        if not 1 <= value <= 5:
            raise ValueError(f"score {value:g} outside 1-5")
        return value
    if label is None:
        raise ValueError("neither score nor label")
    found = label_score(label)
    if found is None:
        raise ValueError(f"label {label!r} is not a known verdict (pass/fail/partial...) and no score given")
    return float(found)


def validate_row(row: dict[str, Any], annotator: str | None) -> dict[str, Any]:
    """A ``HUMAN_LABELS_V1`` row from one input row; raises ``ValueError`` with the reason."""
    missing = [c for c in REQUIRED if _text(row.get(c)) is None]
    if missing:
        raise ValueError(f"empty {', '.join(missing)}")
    l3 = _text(row.get("taxonomy_l3"))
    if l3 is not None and l3 != UNCLASSIFIED and load_taxonomy().classify(l3) is None:
        raise ValueError(f"taxonomy_l3 {l3!r} is not in the taxonomy")
    return {
        "trace_id": str(row["trace_id"]).strip().lower(), "span_id": str(row["span_id"]).strip().lower(),
        "metric": _text(row["metric"]), "score": _score(row), "label": _text(row.get("label")),
        "taxonomy_l3": l3, "annotator": _text(row.get("annotator")) or annotator or "unknown",
        "note": _text(row.get("note")), "imported_unix_nano": 0,
    }


_KEY = ("trace_id", "span_id", "metric", "annotator", "score", "label", "taxonomy_l3")


def _existing(data: Path) -> set[tuple[Any, ...]]:
    con = connect(data, tables=["human_labels"])  # its one table: not every view and macro
    try:
        rows = con.execute("""select trace_id, span_id, metric, annotator, score, label, taxonomy_l3
                              from human_labels qualify row_number() over (
                              partition by trace_id, span_id, metric, annotator
                              order by imported_unix_nano desc) = 1""").fetchall()
    finally:
        con.close()
    return {tuple(r) for r in rows}


def import_labels(data: Path, path: Path, annotator: str | None = None, strict: bool = False) -> ImportResult:
    """Import a label file; with ``strict`` nothing is imported when any row is bad."""
    result = ImportResult()
    good: list[dict[str, Any]] = []
    for line, row in read_rows(path):
        try:
            good.append(validate_row(row, annotator))
        except ValueError as e:
            result.bad.append((line, str(e)))
    if strict and result.bad:
        return result
    with score_lock(data):
        _store_labels(data, good, result)
    return result


def _store_labels(data: Path, good: list[dict[str, Any]], result: ImportResult) -> None:
    seen = _existing(data)
    fresh = [r for r in good if tuple(r[k] for k in _KEY) not in seen]
    result.duplicates = len(good) - len(fresh)
    if fresh:
        now = time.time_ns()
        for r in fresh:
            r["imported_unix_nano"] = now
        table = pa.Table.from_pylist(fresh, schema=HUMAN_LABELS_V1)
        result.path = write_parquet_atomic(table, table_dir(data, "human_labels"))
        result.imported = len(fresh)
        write_human_scores(data)
    result.not_built = _count_not_built(data, fresh)


def _count_not_built(data: Path, rows: list[dict[str, Any]]) -> int:
    if not rows:
        return 0
    con = connect(data, shared_macros=False)  # reads the dag_nodes view: no shared query macro
    try:
        built = {(t, s) for t, s in con.execute("select trace_id, span_id from dag_nodes").fetchall()}
    finally:
        con.close()
    return sum(1 for r in rows if (r["trace_id"], r["span_id"]) not in built)


HUMAN_SCORES_SQL = """
with latest as (
    select * from human_labels qualify row_number() over (
        partition by trace_id, span_id, metric, annotator order by imported_unix_nano desc) = 1
)
select trace_id, span_id, metric, avg(cast(score as double)) as score,
       list(taxonomy_l3) filter (where taxonomy_l3 is not null) as cats,
       list(distinct annotator order by annotator) as annotators,
       list(label) filter (where label is not null) as labels
from latest group by all order by all
"""


def _human_row(r: dict[str, Any]) -> ScoreRow:
    names = ", ".join(r["annotators"])
    row = ScoreRow(r["trace_id"], r["span_id"], None, r["metric"], round(r["score"], 4), "human",
                   label=(r["labels"] or [None])[-1], explanation=f"human label ({names})")
    top = Counter(r["cats"] or []).most_common(1)
    row.category, note = categorize(row.score, top[0][0] if top else None, "the human label names no category")
    if note:
        row.explanation = f"{note}; {row.explanation}"
    return row


def write_human_scores(data: Path) -> Path:
    """Rewrite ``tables/step_scores/human.parquet`` from every human label (atomic replace)."""
    con = connect(data, tables=["human_labels"])  # its one table: not every view and macro
    try:
        rows = con.sql(HUMAN_SCORES_SQL).to_arrow_table().to_pylist()
    finally:
        con.close()
    table = to_table(_human_row(r) for r in rows)
    path: Path = write_parquet_atomic(table, table_dir(data, "step_scores"), stem=HUMAN_FILE_STEM)
    return path
