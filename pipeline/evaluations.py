"""Evaluations carried in spans -> the ``evaluations`` table.

Interim version: returns no rows. The normalization issue replaces it with the extraction of
``gen_ai.evaluation.result`` events, OpenInference annotations/evaluations and EVALUATOR spans.
"""

from __future__ import annotations

import pyarrow as pa

from tracedag.schemas.tables import EVALUATIONS_V1


def extract_evaluations(spans: pa.Table) -> pa.Table:
    """Return one ``EVALUATIONS_V1`` row per evaluation result found in ``spans`` (SPANS_V1)."""
    return EVALUATIONS_V1.empty_table()
