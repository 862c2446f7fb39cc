"""Seeded generator of realistic agent traces as OTLP ``ExportTraceServiceRequest`` batches.

Each trace is one agent run: an ``invoke_agent`` root span, a loop of LLM ``chat`` spans
(OTel GenAI attributes, a few hundred bytes of input/output messages), parallel
``execute_tool`` spans with arguments and results, some tool errors followed by a retry,
and a final answer. About 1.3 KB per span on the wire.

    traces(n_traces, seed)        -> Iterator[ExportTraceServiceRequest] (512 spans per request)
    requests(n_spans, seed)       -> the same, stopping after about ``n_spans`` spans
    make_store(data_dir, n_spans, seed) -> writes a ``spans`` store of about ``n_spans`` spans

Run ``python bench/gen.py --spans 100000 --data /tmp/store`` to build a store from the shell, and
``python bench/gen.py --replicate 10 --from /tmp/store --data /tmp/store10`` for ten times its spans
(``replicate``: new ids; Parquet copied, nothing generated or converted again).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, Span, Status

BATCH_SPANS = 512
_BASE_TIME_NS = 1_764_460_800_000_000_000  # 2025-11-30T00:00:00Z, fixed so runs are reproducible

_SERVICES = ["support-agent", "research-agent", "coding-agent", "billing-agent"]
_MODELS = [("openai", "gpt-4o-mini"), ("openai", "gpt-4.1"), ("anthropic", "claude-sonnet-4"),
           ("aws.bedrock", "llama-3.1-70b")]
_TOOLS = ["search_docs", "get_order", "run_sql", "fetch_url", "send_email", "calculator",
          "read_file", "create_ticket"]
_WORDS = ["the", "order", "customer", "refund", "please", "check", "status", "account", "invoice", "shipping", "delayed", "error", "retry", "summary", "report", "database", "query", "result", "found", "missing", "weather", "policy", "update", "user", "agent", "tool", "call", "response", "answer", "context", "document", "page", "section", "total", "amount", "latest", "version", "issue", "ticket", "priority", "escalate", "resolve", "confirm", "details", "payment", "card", "address"]


def _kv(key: str, value: str | int | float | bool | list[str]) -> KeyValue:
    if isinstance(value, bool):
        return KeyValue(key=key, value=AnyValue(bool_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    if isinstance(value, float):
        return KeyValue(key=key, value=AnyValue(double_value=value))
    if isinstance(value, list):
        arr = AnyValue()
        arr.array_value.values.extend(AnyValue(string_value=v) for v in value)
        return KeyValue(key=key, value=arr)
    return KeyValue(key=key, value=AnyValue(string_value=value))


@dataclass
class _Trace:
    """State of one trace being generated."""

    rng: random.Random
    service: str
    trace_id: bytes
    clock: int
    spans: list[Span] = field(default_factory=list)

    def new_id(self) -> bytes:
        """Return a fresh non-zero span id."""
        return self.rng.getrandbits(64).to_bytes(8, "big") or b"\x00" * 7 + b"\x01"

    def text(self, n_words: int) -> str:
        """Return ``n_words`` of filler prose."""
        return " ".join(self.rng.choice(_WORDS) for _ in range(n_words))


def _span(t: _Trace, name: str, parent: bytes, start: int, dur: int, kind: int = 1) -> Span:
    s = Span(trace_id=t.trace_id, span_id=t.new_id(), parent_span_id=parent, name=name, kind=kind,
             start_time_unix_nano=start, end_time_unix_nano=start + dur)
    t.spans.append(s)
    return s


def _llm_span(t: _Trace, parent: bytes, start: int, agent: str, final: bool) -> Span:
    provider, model = t.rng.choice(_MODELS)
    dur = t.rng.randint(300_000_000, 4_000_000_000)
    s = _span(t, f"chat {model}", parent, start, dur, kind=3)
    in_tok, out_tok = t.rng.randint(200, 6000), t.rng.randint(20, 800)
    msgs_in = [{"role": "system", "parts": [{"type": "text", "content": t.text(36)}]},
               {"role": "user", "parts": [{"type": "text", "content": t.text(t.rng.randint(50, 110))}]}]
    if final:
        out = [{"role": "assistant", "parts": [{"type": "text", "content": t.text(t.rng.randint(40, 90))}],
                "finish_reason": "stop"}]
    else:
        out = [{"role": "assistant", "parts": [{"type": "tool_call", "name": t.rng.choice(_TOOLS),
                                                "id": f"call_{t.rng.getrandbits(48):012x}"}],
                "finish_reason": "tool_calls"}]
    s.attributes.extend([
        _kv("gen_ai.operation.name", "chat"), _kv("gen_ai.provider.name", provider),
        _kv("gen_ai.request.model", model), _kv("gen_ai.response.model", model),
        _kv("gen_ai.response.id", f"chatcmpl-{t.rng.getrandbits(64):016x}"),
        _kv("gen_ai.request.temperature", round(t.rng.random(), 2)),
        _kv("gen_ai.usage.input_tokens", in_tok), _kv("gen_ai.usage.output_tokens", out_tok),
        _kv("gen_ai.response.finish_reasons", ["stop" if final else "tool_calls"]),
        _kv("gen_ai.agent.name", agent), _kv("server.address", "api.example.com"),
        _kv("gen_ai.input.messages", json.dumps(msgs_in, separators=(",", ":"))),
        _kv("gen_ai.output.messages", json.dumps(out, separators=(",", ":"))),
    ])
    return s


def _tool_span(t: _Trace, parent: bytes, start: int, tool: str, fail: bool) -> Span:
    dur = t.rng.randint(5_000_000, 1_500_000_000)
    s = _span(t, f"execute_tool {tool}", parent, start, dur)
    args = {"query": t.text(t.rng.randint(12, 30)), "limit": t.rng.randint(1, 50)}
    s.attributes.extend([
        _kv("gen_ai.operation.name", "execute_tool"), _kv("gen_ai.tool.name", tool),
        _kv("gen_ai.tool.type", "function"), _kv("gen_ai.tool.call.id", f"call_{t.rng.getrandbits(48):012x}"),
        _kv("gen_ai.tool.call.arguments", json.dumps(args, separators=(",", ":"))),
    ])
    if fail:
        s.status.CopyFrom(Status(code=Status.STATUS_CODE_ERROR, message=f"{tool} timed out"))
        s.attributes.append(_kv("error.type", "TimeoutError"))
        ev = s.events.add(name="exception", time_unix_nano=start + dur)
        ev.attributes.extend([_kv("exception.type", "TimeoutError"),
                              _kv("exception.message", f"{tool} did not answer within 30s")])
    else:
        s.attributes.append(_kv("gen_ai.tool.call.result", json.dumps(
            {"ok": True, "items": [t.text(t.rng.randint(25, 55)) for _ in range(t.rng.randint(1, 3))]},
            separators=(",", ":"))))
    return s


def _tool_round(t: _Trace, parent: bytes, start: int) -> int:
    """Parallel tool calls (1-3), each failing with p=0.08 and then retried once; return the end time."""
    end = start
    for tool in t.rng.sample(_TOOLS, t.rng.randint(1, 3)):
        at = start + t.rng.randint(0, 2_000_000)
        s = _tool_span(t, parent, at, tool, fail=t.rng.random() < 0.08)
        if s.status.code == Status.STATUS_CODE_ERROR:
            s = _tool_span(t, parent, s.end_time_unix_nano + 1_000_000, tool, fail=t.rng.random() < 0.2)
        end = max(end, s.end_time_unix_nano)
    return end


def _one_trace(rng: random.Random, index: int) -> _Trace:
    service = rng.choice(_SERVICES)
    t = _Trace(rng, service, rng.getrandbits(128).to_bytes(16, "big"),
               _BASE_TIME_NS + index * 1_500_000_000 + rng.randint(0, 999_999_999))
    agent = service.replace("-agent", "")
    root = _span(t, f"invoke_agent {agent}", b"", t.clock, 0, kind=2)
    root.attributes.extend([
        _kv("gen_ai.operation.name", "invoke_agent"), _kv("gen_ai.agent.name", agent),
        _kv("gen_ai.conversation.id", f"conv-{rng.getrandbits(40):010x}"),
        _kv("gen_ai.input.messages", json.dumps([{"role": "user", "parts": [
            {"type": "text", "content": t.text(rng.randint(20, 50))}]}], separators=(",", ":"))),
    ])
    clock = t.clock + rng.randint(1_000_000, 5_000_000)
    for _ in range(rng.randint(1, 5)):  # the agent loop: think, act
        llm = _llm_span(t, root.span_id, clock, agent, final=False)
        clock = _tool_round(t, root.span_id, llm.end_time_unix_nano + 500_000) + 500_000
    final = _llm_span(t, root.span_id, clock, agent, final=True)
    root.end_time_unix_nano = final.end_time_unix_nano + rng.randint(100_000, 2_000_000)
    root.attributes.append(_kv("gen_ai.output.messages", final.attributes[-1].value.string_value))
    if rng.random() < 0.03:
        root.status.CopyFrom(Status(code=Status.STATUS_CODE_ERROR, message="agent gave up"))
    return t


class _Batcher:
    """Groups spans into requests of ``BATCH_SPANS`` spans, one ResourceSpans per service."""

    def __init__(self) -> None:
        self.by_service: dict[str, list[Span]] = {}
        self.count = 0

    def add(self, service: str, spans: list[Span]) -> Iterator[ExportTraceServiceRequest]:
        """Add a trace's spans; yield each request that fills up."""
        for s in spans:
            self.by_service.setdefault(service, []).append(s)
            self.count += 1
            if self.count >= BATCH_SPANS:
                yield self.flush()

    def flush(self) -> ExportTraceServiceRequest:
        """Return the pending spans as one request and start a new one."""
        req = ExportTraceServiceRequest()
        for service, spans in sorted(self.by_service.items()):
            rs: ResourceSpans = req.resource_spans.add()
            rs.resource.attributes.extend([
                _kv("service.name", service), _kv("service.version", "1.4.2"),
                _kv("telemetry.sdk.language", "python"), _kv("telemetry.sdk.name", "opentelemetry"),
                _kv("deployment.environment", "bench")])
            ss = rs.scope_spans.add()
            ss.scope.name, ss.scope.version = "opentelemetry.instrumentation.openai_v2", "2.1b0"
            ss.spans.extend(spans)
        self.by_service, self.count = {}, 0
        return req


def traces(n_traces: int, seed: int = 0) -> Iterator[ExportTraceServiceRequest]:
    """Yield requests of 512 spans holding ``n_traces`` generated agent traces (the last one smaller)."""
    rng = random.Random(seed)
    batcher = _Batcher()
    for i in range(n_traces):
        t = _one_trace(rng, i)
        yield from batcher.add(t.service, t.spans)
    if batcher.count:
        yield batcher.flush()


def requests(n_spans: int, seed: int = 0) -> Iterator[ExportTraceServiceRequest]:
    """Yield requests until about ``n_spans`` spans (whole batches of 512) have been produced."""
    made = 0
    for req in traces(n_spans, seed):  # n_spans traces is always more than enough
        yield req
        made += sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)
        if made >= n_spans:
            return


def whole_trace_requests(n_spans: int, seed: int = 0) -> Iterator[ExportTraceServiceRequest]:
    """Like ``requests`` but every request holds whole traces only (about 512 spans, never a split trace)."""
    rng = random.Random(seed)
    batcher = _Batcher()
    made, i = 0, 0
    while made < n_spans:
        t = _one_trace(rng, i)
        i += 1
        for s in t.spans:
            batcher.by_service.setdefault(t.service, []).append(s)
        batcher.count += len(t.spans)
        made += len(t.spans)
        if batcher.count >= BATCH_SPANS:
            yield batcher.flush()
    if batcher.count:
        yield batcher.flush()


def payloads(n_spans: int, seed: int = 0) -> list[bytes]:
    """Return serialized requests of about ``n_spans`` spans (for benchmarks that need bytes)."""
    return [r.SerializeToString() for r in requests(n_spans, seed)]


def make_store(data_dir: Path | str, n_spans: int, seed: int = 0) -> int:
    """Write a ``spans`` store of about ``n_spans`` generated spans under ``data_dir``; return the span count.

    The batches go through the ingest converter, so the store has the same layout and
    partitions as one filled by the collector.
    """
    from tracedag.pipeline.ingest.direct import ingest_requests

    return ingest_requests(Path(data_dir), requests(n_spans, seed), received_unix_nano=time.time_ns())


def built_store(data: Path | None, n_spans: int) -> Path:
    """``data`` (a built store a bench was given), or a store of about ``n_spans`` generated spans under
    ``/tmp/tracedag-bench-queries`` (``bench/queries.py``'s), generated and built unless it already is."""
    if data is not None:
        return data
    from tracedag.pipeline.dag.build import build_store
    from tracedag.pipeline.store.files import parquet_files

    data = Path("/tmp/tracedag-bench-queries") / f"spans-{n_spans}"
    if not parquet_files(data, "traces"):
        if not parquet_files(data, "spans"):
            make_store(data, n_spans)
        build_store(data, idle_seconds=0, full=True)
    return data


@contextlib.contextmanager
def linked_copy(src: Path, prefix: str) -> Iterator[Path]:
    """A copy of the store ``src`` in a new temporary directory, removed after: its tables by hard links (a published
    file never changes; a bench's rounds add files beside them), its state copied (a round rewrites it)."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    data = work / "store"
    try:
        data.mkdir()
        subprocess.run(["cp", "-al", str(src / "tables"), str(data / "tables")], check=True)
        shutil.copytree(src / "state", data / "state")
        yield data
    finally:
        shutil.rmtree(work, ignore_errors=True)


def replicate(src: Path, dst: Path, copies: int) -> int:
    """Fill ``dst`` (a new store) with the spans of the store ``src`` ``copies`` times; return the span count.

    Copy 0 is the spans as they are; in copy ``k`` every trace id and span id (parent ids too) starts with
    ``k`` as four hex digits and every conversation id ends with ``-r<k>``: a new set of traces and
    conversations with the shapes, texts and times of the first (the ``attributes`` map keeps the original
    values, as the ``links`` do). Each file is written with the converters' options, row group by row group
    as in its source, under a new name beside it, atomically. It only reads and writes Parquet: 10 copies of
    a 1M-span store took 10.5 min at ``nice -n 15`` on two cores loaded ~20 deep, where generating (and
    converting) the 1M spans took 11 min, so a 10M-span store is ``--replicate 10`` of a 1M one.
    """
    import pyarrow.parquet as pq

    from tracedag.pipeline.store.files import parquet_files
    from tracedag.pipeline.store.parquet import write_atomic_stream

    if parquet_files(dst, "spans"):
        raise SystemExit(f"{dst} already holds spans: give a new directory")
    files = parquet_files(src, "spans")
    if not files or copies < 1 or copies > 0xFFFF:
        raise SystemExit(f"{src}: no spans to copy" if not files else "--replicate: give 1 to 65535 copies")
    made = 0
    for path in files:
        source = pq.ParquetFile(path)
        rel = path.relative_to(src)
        for k in range(copies):
            groups = (_renamed(source.read_row_group(i), k) for i in range(source.num_row_groups))
            name = rel.name if k == 0 else f"{rel.stem}-r{k}.parquet"
            write_atomic_stream(groups, source.schema_arrow, dst / rel.parent / name, row_group_size=1 << 30)
            made += source.metadata.num_rows
    return made


def _renamed(table: Any, k: int) -> Any:
    """The spans of ``table`` as copy ``k`` (ids prefixed with ``k``, conversations suffixed)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if k == 0:
        return table
    prefix = pa.scalar(f"{k:04x}")

    def ids(col: Any) -> Any:
        moved = pc.binary_join_element_wise(prefix, pc.utf8_slice_codeunits(col, 4), "")
        return pc.if_else(pc.equal(col, ""), col, moved)

    out = {"trace_id": ids, "span_id": ids, "parent_span_id": ids,
           "conversation_id": lambda col: pc.binary_join_element_wise(col, pa.scalar(f"-r{k}"), "")}
    for name, change in out.items():
        i = table.schema.get_field_index(name)
        table = table.set_column(i, table.schema.field(i), change(table.column(i)).cast(table.schema.field(i).type))
    return table


def main(argv: list[str] | None = None) -> int:
    """Command line: build a store, copy one ``--replicate`` times, or print the size figures of the batches."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--spans", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data", type=Path, help="write a spans store here (else print batch sizes)")
    ap.add_argument("--replicate", type=int, metavar="K",
                    help="with --from: fill --data with K copies of that store's spans (new trace, span and "
                         "conversation ids), instead of generating spans")
    ap.add_argument("--from", dest="source", type=Path, help="the store --replicate copies")
    args = ap.parse_args(argv)
    if (args.replicate is None) != (args.source is None) or (args.replicate is not None and not args.data):
        ap.error("--replicate K needs --from STORE and --data NEW_STORE")
    if args.replicate is not None:
        t0 = time.perf_counter()
        n = replicate(args.source, args.data, args.replicate)
        print(f"wrote {n} spans ({args.replicate} copies of {args.source}) under {args.data} "
              f"in {time.perf_counter() - t0:.1f}s")
        return 0
    if args.data:
        n = make_store(args.data, args.spans, args.seed)
        print(f"wrote {n} spans under {args.data}")
        return 0
    bodies = payloads(args.spans, args.seed)
    n = sum(len(ExportTraceServiceRequest.FromString(b).resource_spans[0].scope_spans[0].spans) for b in bodies[:1])
    total = sum(len(b) for b in bodies)
    spans = sum(sum(len(ss.spans) for rs in ExportTraceServiceRequest.FromString(b).resource_spans
                    for ss in rs.scope_spans) for b in bodies)
    print(f"{len(bodies)} requests, {spans} spans, {total} bytes, {total / spans:.0f} B/span (first rs {n})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
