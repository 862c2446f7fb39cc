"""The conversion facade: serialized OTLP requests -> one ``Converted`` batch of normalized span rows.

``convert_records`` tries the lockstep wire decoder (``wirespans``), then the per-span wire
builder (``columnar.WireBuilder``), then record by record, and normalizes the result. The
decoders below it never import this module. ``convert.pool`` spreads the same function over
worker processes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import numpy as np
import pyarrow as pa
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tracedag.collector.wire import parse_request
from tracedag.pipeline.convert.columnar import ColumnBuilder, WireBuilder
from tracedag.pipeline.convert.converted import Converted, SpanDecoder
from tracedag.pipeline.convert.wirespans import SpanBuilder, Unusual
from tracedag.pipeline.normalize.spans import normalize

logger = logging.getLogger(__name__)


def convert_records(
    records: list[tuple[bytes, int]], batch_id: str, shard: tuple[int, int] = (0, 1), *, consume: bool = False,
) -> Converted:
    """Convert serialized requests with their receive times into one ``Converted`` batch.

    The wire path (``columnar.WireBuilder``) is tried first; if any payload does not parse or holds
    invalid UTF-8, the batch is converted record by record instead, skipping the payloads that do
    not parse (counted in ``bad_records``). ``shard=(w, k)`` keeps only the traces whose last id
    byte is ``w`` mod ``k`` (``convert.pool`` runs one shard per worker process, so normalization
    sees whole traces). With ``consume``, ``records`` is emptied
    once its spans are decoded, so the payloads are freed before normalization (the converter's
    peak memory).
    """
    try:
        conv = _wire_base(records, batch_id, shard)
    except (DecodeError, pa.ArrowInvalid, ValueError, IndexError) as exc:
        logger.info("batch %s: converting record by record (%s)", batch_id, exc)
        conv = _record_by_record(records, batch_id, shard)
    if consume:
        records.clear()
    conv.table = normalize(conv.table)
    return conv


def _record_by_record(records: list[tuple[bytes, int]], batch_id: str, shard: tuple[int, int]) -> Converted:
    """Base columns of the payloads that parse, one request at a time; the others counted in ``bad_records``."""
    good: list[tuple[ExportTraceServiceRequest, int]] = []
    bad = 0
    for payload, received in records:
        try:
            good.append((parse_request(payload), received))
        except DecodeError:
            bad += 1
    conv = _fast_base(good, batch_id, shard)
    conv.bad_records = bad
    return conv


def convert_wire(records: list[tuple[bytes, int]], batch_id: str, shard: tuple[int, int] = (0, 1)) -> Converted:
    """Convert serialized requests from the wire: spans decoded in lockstep (``wirespans``), else
    one by one with their attributes decoded for the whole batch (``columnar.WireBuilder``)."""
    conv = _wire_base(records, batch_id, shard)
    conv.table = normalize(conv.table)
    return conv


def _wire_base(records: list[tuple[bytes, int]], batch_id: str, shard: tuple[int, int]) -> Converted:
    """``convert_wire`` without normalization (``BASE_SCHEMA`` columns)."""
    if shard == (0, 1):
        try:
            return _base_with(SpanBuilder(), records, batch_id)
        except Unusual as exc:
            logger.info("batch %s: spans decoded one by one (%s)", batch_id, exc)
    return _base_with(WireBuilder(shard), records, batch_id)


def _base_with(builder: SpanDecoder, records: list[tuple[bytes, int]], batch_id: str) -> Converted:
    for payload, received in records:
        builder.add_payload(payload, received)
    base, keys, content = builder.finish(batch_id)
    return Converted(base, keys, content, positions=np.array(builder.positions, dtype=np.int64))


def convert_fast(
    records: Iterable[tuple[ExportTraceServiceRequest, int]], batch_id: str, shard: tuple[int, int] = (0, 1)
) -> Converted:
    """Convert (request, received) pairs with the columnar builder; equal to ``convert_reference``."""
    conv = _fast_base(records, batch_id, shard)
    conv.table = normalize(conv.table)
    return conv


def _fast_base(
    records: Iterable[tuple[ExportTraceServiceRequest, int]], batch_id: str, shard: tuple[int, int]
) -> Converted:
    """``convert_fast`` without normalization."""
    builder = ColumnBuilder(shard)
    for request, received in records:
        builder.add(request, received)
    base, keys, content = builder.finish(batch_id)
    return Converted(base, keys, content, positions=np.array(builder.positions, dtype=np.int64))
