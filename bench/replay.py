"""Benchmark of ``tracedag replay``: conversations/s with the example agent, and recorded tools' cost.

Throughput: a source store of ``--conversations`` conversations of the example agent (four
scripts: booking, re-asked details, declined proposal, opening hours) is replayed once with
``--agent example`` at ``--parallel`` 1 and 4, into a fresh copy of the store through the
in-process collector, as the command does (time to the last span stored: the collector's flush
included). Baseline, same run: the same conversations held by the agent directly inside run
labels, one after the other, exporting to the same kind of collector (what ``tracedag simulate``
does per conversation): the cost of the agent itself.

Recorded tools: ``--calls`` tool steps (``td.tool`` + ``Step.run``, 50 distinct argument sets,
spans to an exporter that drops them): baseline, the tool runs live (no recording); served, every
call answered from a ``ToolRecording``. Reported per call; the overhead is served minus live.

Medians of ``--runs``.

    python bench/replay.py --conversations 40 --runs 3
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from tracedag import instrument as td
from tracedag.pipeline.demo.agent.booking_agent import BookingAgent
from tracedag.pipeline.demo.replay_example import example_target
from tracedag.pipeline.replay import ReplayConfig, Selection, replay, select_conversations
from tracedag.pipeline.service import CollectorConfig, RunningCollector, start_collector

SCRIPTS = (
    ("Hi, I'd like to book a tennis court.", "Saturday at 18:00.", "Yes, please book it."),
    ("Can I reserve a court to play tennis?", "Next tuesday.", "At 7pm.", "Sure, book it."),
    ("Hello! Please book me a court for a match.", "Friday at 09:30, please.", "No, that does not suit me."),
    ("What are your opening hours?",),
)


def _collector(data: Path) -> RunningCollector:
    return start_collector(CollectorConfig(data=data, http_port=0, grpc_port=None))


def make_source(data: Path, n: int, latency: float) -> None:
    """``n`` conversations of the example agent stored in ``data``."""
    collector = _collector(data)
    try:
        td.configure(f"http://127.0.0.1:{collector.http_port}", service_name="court-booking-agent",
                     set_global=False)
        for i in range(n):
            agent = BookingAgent.create("constrained", random.Random(i), random.Random(-i), latency_scale=latency)
            with td.conversation(f"src-{i:04d}"):
                agent.run(list(SCRIPTS[i % len(SCRIPTS)]))
        td.force_flush()
        td.shutdown()
        collector.flush()
    finally:
        collector.stop()


def _timed(source: Path, work: Callable[[str], None]) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        shutil.copytree(source, data)
        started = time.perf_counter()
        collector = _collector(data)
        try:
            work(f"http://127.0.0.1:{collector.http_port}")
            collector.flush()
        finally:
            collector.stop()
        return time.perf_counter() - started


def direct(sources: Sequence[object], latency: float) -> Callable[[str], None]:
    """Baseline: the agent holds each conversation inside run labels, no replay machinery."""
    def work(endpoint: str) -> None:
        td.configure(endpoint, service_name="court-booking-agent", set_global=False)
        for i, s in enumerate(sources):
            agent = BookingAgent.create("constrained", random.Random(i), random.Random(-i), latency_scale=latency)
            with td.conversation(f"direct-{i}"), td.run_labels(run_id=f"direct-{i}", scenario_id=s.conversation_id):  # type: ignore[attr-defined]
                agent.run(list(s.turns))  # type: ignore[attr-defined]
        td.force_flush()
        td.shutdown()

    return work


def replayed(sources: Sequence[object], parallel: int, latency: float) -> Callable[[str], None]:
    """``tracedag replay --agent example --parallel P`` (the library call the command makes)."""
    target = example_target({"latency_scale": str(latency)})

    def work(endpoint: str) -> None:
        replay(sources, target, ReplayConfig(endpoint=endpoint, parallel=parallel, set_global=False))  # type: ignore[arg-type]

    return work


class _Drop(SpanExporter):
    def export(self, spans: object) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def tool_calls(calls: int, served: bool) -> float:
    """Seconds per tool call, live or served from a recording."""
    td.configure(service_name="bench", exporter=_Drop(), set_global=False)
    recording = td.ToolRecording([td.RecordedCall("lookup", f'{{"k": {k}}}', f'{{"v": {k}}}') for k in range(50)])

    def lookup(k: int) -> dict[str, int]:
        return {"v": k}

    started = time.perf_counter()
    if served:
        with td.recorded_tools(recording):
            _calls(calls, lookup)
        assert recording.served == calls
    else:
        _calls(calls, lookup)
    elapsed = time.perf_counter() - started
    td.shutdown()
    return elapsed / calls


def _calls(n: int, fn: Callable[..., object]) -> None:
    for i in range(n):
        args = {"k": i % 50}
        with td.tool("lookup", arguments=args) as step:
            step.set_result(step.run(fn, **args))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conversations", type=int, default=40)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--latency-scale", type=float, default=1.0, help="the example agent's simulated latency")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "source"
        make_source(source, args.conversations, args.latency_scale)
        sources = select_conversations(source, Selection())
        n = len(sources)
        cases = {"baseline: agent held directly, P=1": direct(sources, args.latency_scale),
                 "replay --parallel 1": replayed(sources, 1, args.latency_scale),
                 "replay --parallel 4": replayed(sources, 4, args.latency_scale)}
        base = 0.0
        print(f"replay throughput, {n} conversations of the example agent (latency scale {args.latency_scale:g}), "
              f"median of {args.runs}")
        for name, work in cases.items():
            rate = n / statistics.median(_timed(source, work) for _ in range(args.runs))
            base = base or rate
            print(f"  {name:<38} {rate:8.1f} conversations/s   x{rate / base:.2f} of baseline")
    live = statistics.median(tool_calls(args.calls, False) for _ in range(args.runs))
    served = statistics.median(tool_calls(args.calls, True) for _ in range(args.runs))
    print(f"tool calls ({args.calls} per run, median of {args.runs})")
    print(f"  baseline: live tool in a td.tool step  {live * 1e6:8.1f} us/call")
    print(f"  served from the recording              {served * 1e6:8.1f} us/call   overhead {(served - live) * 1e6:+.1f} us/call")


if __name__ == "__main__":
    main()
