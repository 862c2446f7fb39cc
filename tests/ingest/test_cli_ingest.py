"""``tracedag ingest FILE...`` on each dump format, with bad lines and invalid spans."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from click.testing import CliRunner
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from bench.gen import requests
from tests.ingest.ingest_support import otlp_json, otlp_json_line, request_ids, span_count, stored, stored_ids
from tracedag.pipeline.cli import cli
from tracedag.pipeline.ingest.dumps import read_dump


def _reqs(n: int, seed: int) -> list[ExportTraceServiceRequest]:
    return list(requests(n, seed))


def _ingest(data: Path, *files: Path) -> str:
    result = CliRunner().invoke(cli, ["ingest", *map(str, files), "--data", str(data)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.output


def _row(output: str, name: str) -> list[str]:
    line = next(ln for ln in output.splitlines() if name in ln)
    return [c.strip() for c in line.split("│")[1:-1]]


def test_json_lines_dump(data: Path, tmp_path: Path) -> None:
    reqs = _reqs(1500, 41)
    f = tmp_path / "traces.jsonl"
    f.write_text("".join(otlp_json_line(r) + "\n" for r in reqs))
    out = _ingest(data, f)
    n = sum(span_count(r) for r in reqs)
    assert _row(out, "traces.jsonl")[:4] == ["traces.jsonl", "jsonl", str(n), str(n)]
    assert stored_ids(data) == request_ids(reqs)


def test_single_json_document_pretty_printed(data: Path, tmp_path: Path) -> None:
    req = _reqs(300, 42)[0]
    f = tmp_path / "one.json"
    f.write_text(json.dumps(otlp_json(req), indent=2))
    assert read_dump(f)[0] == "json"
    _ingest(data, f)
    assert stored_ids(data) == request_ids([req])


def test_length_prefixed_protobuf_and_gzip_and_reingest_is_deduplicated(data: Path, tmp_path: Path) -> None:
    reqs = _reqs(1200, 43)
    raw = b"".join(len(b).to_bytes(4, "big") + b for b in (r.SerializeToString() for r in reqs))
    f, gz = tmp_path / "traces.pb", tmp_path / "traces.pb.gz"
    f.write_bytes(raw)
    gz.write_bytes(gzip.compress(raw))
    out = _ingest(data, f, gz)
    n = sum(span_count(r) for r in reqs)
    assert _row(out, "traces.pb ")[1:5] == ["protobuf", str(n), str(n), "0"]
    assert _row(out, "traces.pb.gz")[1:5] == ["protobuf", str(n), "0", str(n)]
    assert stored(data) == (n, n)


def test_bad_lines_and_invalid_spans_are_reported_and_skipped(data: Path, tmp_path: Path) -> None:
    reqs = _reqs(1024, 44)
    bad_span = ExportTraceServiceRequest()
    bad_span.CopyFrom(reqs[1])
    first = bad_span.resource_spans[0].scope_spans[0].spans[0]
    first.trace_id = bytes(16)  # all zero: invalid, rejected like the collector does
    lines = [otlp_json_line(reqs[0]), "{not json", '{"resourceSpans": 5}', otlp_json_line(bad_span)]
    f = tmp_path / "mixed.jsonl"
    f.write_text("\n".join(lines) + "\n")
    result = CliRunner().invoke(cli, ["ingest", str(f), "--data", str(data)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "line 2" in result.output and "line 3" in result.output
    assert "trace_id is all zero" in result.output
    expected = request_ids([reqs[0], bad_span]) - {(bytes(16).hex(), first.span_id.hex())}
    assert stored_ids(data) == expected
    _fmt, items = read_dump(f)
    assert [i.error is None for i in items] == [True, False, False, True]


def test_truncated_protobuf_dump_keeps_the_complete_records(data: Path, tmp_path: Path) -> None:
    reqs = _reqs(1024, 45)
    raw = b"".join(len(b).to_bytes(4, "big") + b for b in (r.SerializeToString() for r in reqs))
    f = tmp_path / "cut.pb"
    f.write_bytes(raw[:-100])
    out = _ingest(data, f)
    assert "truncated" in out
    assert stored_ids(data) == request_ids(reqs[:1])


def test_a_line_with_a_lone_surrogate_is_reported_and_the_others_stored(data: Path, tmp_path: Path) -> None:
    reqs = _reqs(3000, 46)
    assert len(reqs) >= 3
    poisoned = otlp_json_line(reqs[1]).replace('"name": "', '"name": "\\ud800', 1).replace('"name":"', '"name":"\\ud800', 1)
    assert "\\ud800" in poisoned
    f = tmp_path / "surrogate.jsonl"
    f.write_text("\n".join([otlp_json_line(reqs[0]), poisoned, otlp_json_line(reqs[2])]) + "\n")
    out = _ingest(data, f)
    assert "line 2" in out and "surrogate" in out
    assert stored_ids(data) == request_ids([reqs[0], reqs[2]])
