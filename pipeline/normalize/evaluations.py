"""Evaluations carried in spans -> the ``evaluations`` table (one row per result).

Three carriers (CONVENTIONS.md §2.2-2.3):

- ``gen_ai.evaluation.result`` span events (``gen_ai.evaluation.name``, ``.score.value``,
  ``.score.label``, ``.explanation``, ``gen_ai.response.id``): the target is the span whose
  ``gen_ai.response.id`` equals the event's, when one is in the table given, else the span that
  owns the event (the conventions parent the event to the evaluated operation);
- OpenInference ``annotations.{i}.annotation.*`` / ``evaluations.{i}.evaluation.*`` span
  attributes (``name``, ``score``, ``label``, ``explanation``, ``annotator_kind``): the target is
  the span itself, or, on an EVALUATOR carrier span, the span its (single) link points to;
- EVALUATOR spans (``openinference.span.kind = EVALUATOR``) with a link but no annotation
  attributes: one row named after the span, with its output text as explanation.

The spans are scanned with Arrow kernels; Python only builds the (few) result rows.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracedag.pipeline.normalize.extract import Entries, all_null, family, map_entries, pick
from tracedag.schemas.tables import EVALUATIONS_V1

logger = logging.getLogger(__name__)

EVENT_NAME = "gen_ai.evaluation.result"
_EVENT_KEYS = [
    "gen_ai.evaluation.name",
    "gen_ai.evaluation.score.value",
    "gen_ai.evaluation.score.label",
    "gen_ai.evaluation.explanation",
    "gen_ai.response.id",
]
_OI = r"^(?P<fam>annotations|evaluations)\.(?P<idx>\d+)\.(?:annotation|evaluation)\.(?P<field>[a-z_]+)$"


def extract_evaluations(spans: pa.Table) -> pa.Table:
    """Return one ``EVALUATIONS_V1`` row per evaluation result found in ``spans`` (SPANS_V1)."""
    if spans.num_rows == 0:
        return EVALUATIONS_V1.empty_table()
    meta = _Meta(spans)
    entries = map_entries(spans["attributes"])
    links = _first_links(spans, entries)
    rows = (_event_rows(spans, meta) + _attribute_rows(entries, meta, links)
            + _evaluator_span_rows(spans, entries, meta, links))
    if not rows:
        return EVALUATIONS_V1.empty_table()
    return pa.Table.from_pylist(rows, schema=EVALUATIONS_V1)


class _Meta:
    """The span columns a result row copies, as Python lists, built only when a first row needs them
    (most batches carry no evaluation: converting 5 columns per chunk cost more than the scan)."""

    COLUMNS = ["trace_id", "span_id", "received_unix_nano", "batch_id", "end_time_unix_nano"]

    def __init__(self, spans: pa.Table) -> None:
        self.spans = spans
        self.lists: dict[str, list[Any]] | None = None

    def __getitem__(self, column: str) -> list[Any]:
        if self.lists is None:
            self.lists = self.spans.select(self.COLUMNS).to_pydict()
        return self.lists[column]


def _base_row(meta: _Meta, i: int, kind: str) -> dict[str, Any]:
    return {
        "trace_id": meta["trace_id"][i],
        "span_id": meta["span_id"][i],
        "source_span_id": meta["span_id"][i],
        "source_kind": kind,
        "time_unix_nano": meta["end_time_unix_nano"][i],
        "received_unix_nano": meta["received_unix_nano"][i],
        "batch_id": meta["batch_id"][i],
    }


def _score(v: Any) -> float | None:
    try:
        return float(v) if v is not None and v != "" else None
    except ValueError:
        return None


def _event_rows(spans: pa.Table, meta: _Meta) -> list[dict[str, Any]]:
    ev = spans["events"].combine_chunks()
    offsets = np.asarray(ev.offsets, dtype=np.int64)
    flat = ev.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    owners = np.repeat(np.arange(len(ev)), np.diff(offsets))
    hit = np.asarray(pc.fill_null(pc.equal(flat.field("name"), EVENT_NAME), False), dtype=bool)
    if not hit.any():
        return []
    flat = flat.filter(pa.array(hit))
    attrs = flat.field("attributes")
    vals = {k: pc.map_lookup(attrs, k, "last").to_pylist() for k in _EVENT_KEYS}
    times = flat.field("time_unix_nano").to_pylist()
    by_response = _spans_by_response_id(spans)
    rows = []
    for j, owner in enumerate(owners[hit].tolist()):
        row = _base_row(meta, owner, EVENT_NAME)
        resp = vals["gen_ai.response.id"][j]
        if resp and resp in by_response:
            row["trace_id"], row["span_id"] = by_response[resp]
        row.update(
            name=vals["gen_ai.evaluation.name"][j],
            score_value=_score(vals["gen_ai.evaluation.score.value"][j]),
            label=vals["gen_ai.evaluation.score.label"][j],
            explanation=vals["gen_ai.evaluation.explanation"][j],
            response_id=resp,
            time_unix_nano=times[j],
        )
        rows.append(row)
    return rows


def _spans_by_response_id(spans: pa.Table) -> dict[str, tuple[str, str]]:
    resp = pick(map_entries(spans["attributes"]), ["gen_ai.response.id"])["gen_ai.response.id"]
    has = pc.is_valid(resp)
    ids = resp.filter(has).to_pylist()
    trace = spans["trace_id"].filter(has).to_pylist()
    span = spans["span_id"].filter(has).to_pylist()
    return {r: (t, s) for r, t, s in zip(ids, trace, span, strict=True)}


def _first_links(spans: pa.Table, entries: Entries) -> dict[int, tuple[str, str]]:
    """Row -> (trace_id, span_id) of its first link, for EVALUATOR spans only."""
    kind = pick(entries, ["openinference.span.kind"])["openinference.span.kind"]
    if all_null(kind):
        return {}
    is_eval = np.asarray(pc.fill_null(pc.equal(pc.utf8_upper(kind), "EVALUATOR"), False), dtype=bool)
    out: dict[int, tuple[str, str]] = {}
    for i in np.flatnonzero(is_eval).tolist():
        links = spans["links"][i].as_py() or []
        if links:
            out[i] = (links[0]["trace_id"], links[0]["span_id"])
    return out


def _attribute_rows(entries: Entries, meta: _Meta, links: dict[int, tuple[str, str]]) -> list[dict[str, Any]]:
    rows_out: list[dict[str, Any]] = []
    for fam_name in ("annotations", "evaluations"):
        fam = family(entries, f"{fam_name}.", _OI)
        if fam.num_rows == 0:
            continue
        grouped: dict[tuple[int, int], dict[str, str]] = {}
        for r, idx, field, value in zip(*(fam[c].to_pylist() for c in ("row", "idx", "field", "value")), strict=True):
            grouped.setdefault((r, idx), {})[field] = value
        kind = f"openinference.{fam_name[:-1]}"
        for (r, _), f in sorted(grouped.items()):
            row = _base_row(meta, r, kind)
            if r in links:
                row["trace_id"], row["span_id"] = links[r]
            row.update(name=f.get("name"), score_value=_score(f.get("score")), label=f.get("label"),
                       explanation=f.get("explanation"), evaluator=f.get("annotator_kind"))
            rows_out.append(row)
    return rows_out


def _evaluator_span_rows(spans: pa.Table, entries: Entries, meta: _Meta,
                         links: dict[int, tuple[str, str]]) -> list[dict[str, Any]]:
    if not links:
        return []
    keys = list(pick(entries, ["annotations.0.annotation.name", "evaluations.0.evaluation.name"]).values())
    carried = pc.is_valid(pc.coalesce(*keys)).to_pylist()
    names = spans["step_name"].to_pylist()
    texts = spans["output_text"].to_pylist()
    rows = []
    for i, target in sorted(links.items()):
        if carried[i]:
            continue
        row = _base_row(meta, i, "openinference.evaluator_span")
        row["trace_id"], row["span_id"] = target
        row.update(name=names[i], explanation=texts[i], score_value=_score(texts[i]))
        rows.append(row)
    return rows
