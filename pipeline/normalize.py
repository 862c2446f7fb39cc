"""Normalization: one agent vocabulary over OTel GenAI, OpenInference and OpenLLMetry spans.

Interim version: adds the agent columns of ``SPANS_V1`` as nulls. The normalization issue
replaces it with the real mapping.
"""

from __future__ import annotations

import pyarrow as pa

from tracedag.schemas.spans import AGENT_FIELDS, SPANS_V1


def normalize(base: pa.Table) -> pa.Table:
    """Return ``base`` (``BASE_SCHEMA`` columns) with the agent columns of ``SPANS_V1`` filled."""
    n = base.num_rows
    for f in AGENT_FIELDS:
        base = base.append_column(f, pa.nulls(n, f.type))
    return base.cast(SPANS_V1)
