"""What every decoder produces: ``Converted`` rows, and the ``SpanDecoder`` protocol of the builders."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pyarrow as pa


@dataclass
class Converted:
    """Spans of a batch: the normalized ``SPANS_V1`` table plus each row's dedupe key and content hash."""

    table: pa.Table
    keys: np.ndarray
    content: np.ndarray
    bad_records: int = 0  # payloads that did not parse
    positions: np.ndarray | None = None  # row -> index among all spans of the batch (sharded only)


class SpanDecoder(Protocol):
    """A builder of ``BASE_SCHEMA`` rows from serialized requests (``wirespans``, ``columnar``)."""

    positions: list[int]

    def add_payload(self, payload: bytes, received_unix_nano: int) -> None:
        """Decode one serialized ``ExportTraceServiceRequest``."""

    def finish(self, batch_id: str) -> tuple[pa.Table, np.ndarray, np.ndarray]:
        """Return the base table, the dedupe keys and the content hashes of everything added."""
