"""Helpers for the ingest tests: spool segments in the real format, counts through the real views."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tracedag.collector.spoolfmt import SEALED_SUFFIX, encode_record, segment_name
from tracedag.pipeline.store.views import connect

ROOT = Path(__file__).resolve().parents[2]


def write_segment(data: Path, seq: int, records: list[tuple[bytes, int]]) -> Path:
    """Write a sealed spool segment holding ``records`` (payload, received ns)."""
    spool = data / "spool"
    spool.mkdir(parents=True, exist_ok=True)
    path = spool / segment_name(seq, SEALED_SUFFIX)
    with open(path, "wb") as fh:
        for payload, received in records:
            fh.write(encode_record(payload, received))
        fh.flush()
        os.fsync(fh.fileno())
    return path


def span_count(request: ExportTraceServiceRequest) -> int:
    """Number of spans in a request."""
    return sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)


def stored(data: Path) -> tuple[int, int]:
    """(rows, distinct (trace_id, span_id)) in the spans view."""
    row = connect(data, shared_macros=False).execute("select count(*), count(distinct (trace_id, span_id)) from spans").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def stored_ids(data: Path) -> set[tuple[str, str]]:
    """The (trace_id, span_id) pairs in the spans view."""
    return {(t, s) for t, s in connect(data, shared_macros=False).execute("select trace_id, span_id from spans").fetchall()}


def request_ids(requests: list[ExportTraceServiceRequest]) -> set[tuple[str, str]]:
    """The hex (trace_id, span_id) pairs of requests."""
    return {(s.trace_id.hex(), s.span_id.hex()) for r in requests for rs in r.resource_spans
            for ss in rs.scope_spans for s in ss.spans}


def otlp_json(request: ExportTraceServiceRequest) -> dict[str, Any]:
    """OTLP/JSON of a request as the Collector's file exporter writes it (hex ids, not base64)."""
    doc = MessageToDict(request)

    def fix(obj: Any) -> None:
        if isinstance(obj, dict):
            for key in ("traceId", "spanId", "parentSpanId"):
                if key in obj:
                    obj[key] = base64.b64decode(obj[key]).hex()
            for v in obj.values():
                fix(v)
        elif isinstance(obj, list):
            for v in obj:
                fix(v)

    fix(doc)
    return doc


def otlp_json_line(request: ExportTraceServiceRequest) -> str:
    """One JSON line of the file exporter."""
    return json.dumps(otlp_json(request), separators=(",", ":"))


@pytest.fixture
def data(tmp_path: Path) -> Path:
    """An empty data directory."""
    d = tmp_path / "data"
    d.mkdir()
    return d
