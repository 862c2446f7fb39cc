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
from tracedag.pipeline.service import CollectorConfig, start_collector
from tracedag.pipeline.store.views import connect


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


def test_ingested_files_take_the_spool_and_build_at_once(data: Path, tmp_path: Path) -> None:
    reqs = _reqs(900, 47)
    f = tmp_path / "complete.jsonl"
    f.write_text("".join(otlp_json_line(r) + "\n" for r in reqs))
    _ingest(data, f)
    done = sorted(p.name for p in (data / "spool" / "done").iterdir())
    assert done and all(n.startswith("seg-") and n.endswith(".file.sealed") for n in done), done
    assert not list((data / "spool").glob("*.sealed")) and not list((data / "spool").glob("*.filling"))
    con = connect(data)
    assert con.execute("select count(*) from spans where batch_id not like 'seg-%-file'").fetchone()[0] == 0
    traces = con.execute("select count(distinct trace_id) from spans").fetchone()[0]
    built = CliRunner().invoke(cli, ["build", "--data", str(data)])  # the default idle window of live traffic
    assert built.exit_code == 0, built.output
    assert "in the last" not in built.output
    assert connect(data).execute("select count(*) from traces").fetchone()[0] == traces


def test_ingest_beside_a_running_collector_loses_and_doubles_nothing(data: Path, tmp_path: Path) -> None:
    from tests.collector.collector_support import make_request, make_span, post

    reqs = _reqs(2000, 48)
    f = tmp_path / "beside.pb"
    f.write_bytes(b"".join(len(b).to_bytes(4, "big") + b for b in (r.SerializeToString() for r in reqs)))
    c = start_collector(CollectorConfig(data=data, http_port=0, grpc_port=0, convert_process=True))
    try:
        live = make_request([make_span(i, trace=bytes([0xAB] * 16)) for i in range(20)])
        assert post(c.http_port, live.SerializeToString()).status == 200
        _ingest(data, f)
        _ingest(data, f)  # again: every span is a duplicate now
        c.flush()
    finally:
        c.stop(2)
    assert stored(data) == (span_count_all(reqs) + 20, span_count_all(reqs) + 20)


def span_count_all(reqs) -> int:
    return sum(span_count(r) for r in reqs)


def test_an_abandoned_file_segment_is_removed_not_converted(data: Path) -> None:
    import os
    import time

    from tracedag.pipeline.ingest.direct import remove_abandoned

    spool = data / "spool"
    spool.mkdir(parents=True)
    old, fresh = spool / "seg-00000000000000000001.file.filling", spool / "seg-00000000000000000002.file.filling"
    old.write_bytes(b"half a segment")
    fresh.write_bytes(b"being written")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    assert remove_abandoned(data) == 1
    assert not old.exists() and fresh.exists()
