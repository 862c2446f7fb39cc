"""Drive an agent target through stored conversations N times, each run labelled in its spans.

Every run is one conversation held with the target inside ``tracedag.instrument`` run labels:
``run_id`` (``<replay_id>/<source conversation>/r<i>``), ``scenario_id`` (the source's own
``scenario_id``, else the source conversation), ``replay_index`` (after the source's:
``PlannedRun.replay_label``), ``variant_id`` (the source's on exact replays, ``v1``… on rewrites, ``<source's>.v1`` when it had one), ``replay_id``,
``source_trace_id`` and ``source_conversation_id``, plus every ``--label``; the conversation id of
the spans is the run id. So ``tracedag regress`` pairs the replays with the traffic they replay and
``tracedag validate check`` checks them against the model learned on it. ``service_version`` (a
resource attribute, as the agent's own) comes from ``--label service_version=…`` or the target.

A run whose agent failed (the example agent's failed steps) ran to its end: a result. A run that
could not run to its end (the agent raised, was unreachable, its engine task died) is ``stopped``;
an agent that raised leaves one ``replay_error`` span with its error (``targets.record_failure``)
so the store shows the run even when the agent's own spans do not. Either way the next run goes on.
Every span export is counted (``export.CountingExporter``): ``ReplayResult.export`` says how many
spans the collector did not take. Ctrl-C stops starting runs, lets the running ones finish, and
flushes: every finished run is kept.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Literal

from opentelemetry.sdk.trace.export import SpanExporter

from tracedag import instrument as td
from tracedag.instrument.recorded import ToolRecording
from tracedag.pipeline.engine import Engine
from tracedag.pipeline.replay.export import CountingExporter, Delivery, otlp_exporter
from tracedag.pipeline.replay.source import SourceConversation
from tracedag.pipeline.replay.targets import (
    Outcome,
    ReplayTargetError,
    RunInfo,
    Target,
    describe_error,
    record_failure,
)
from tracedag.pipeline.replay.variants import Rewriter, RuleRewriter, variant_turns

logger = logging.getLogger(__name__)

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class ReplayConfig:
    """How many times, how parallel, where the spans go, and the labels every run carries."""

    endpoint: str
    times: int = 1
    parallel: int = 1
    labels: Mapping[str, str] = field(default_factory=dict)
    replay_id: str | None = None
    protocol: td.setup.Protocol = "http/protobuf"
    tools: Literal["live", "recorded"] = "live"
    unmatched: Literal["live", "fail"] = "live"
    variants: int = 0
    rewriter: Rewriter | None = None  # default: the offline rules
    set_global: bool = True  # install the provider as the global one (agents on plain OpenTelemetry)
    engine: Engine | None = None  # hold each run as one task of this engine (None: threads of this process)


@dataclass(frozen=True)
class PlannedRun:
    """One run to hold: which conversation, which replay."""

    source: SourceConversation
    replay_index: int
    replay_id: str
    variant_id: str | None = None  # None: the exact turns; v1..vK: rewritten turns
    variant_turns: tuple[str, ...] | None = None
    times: int = 1  # replays of each conversation (numbers the replay_index label)

    @property
    def turns(self) -> tuple[str, ...]:
        """The user turns this run sends."""
        return self.variant_turns if self.variant_turns is not None else self.source.turns

    @property
    def replay_label(self) -> int:
        """The run's ``replay_index`` label: the source's index x ``times`` + this replay's, so the replays
        of a scenario are numbered apart and a single replay of each run keeps its source's index (the
        regression gate pairs it with its source); this replay's index when the source has none."""
        source: int | None = self.source.replay_index
        return self.replay_index if source is None else source * self.times + self.replay_index

    @property
    def variant_label(self) -> str | None:
        """The run's ``variant_id`` label: the source's on an exact replay (same turns), this rewrite's
        otherwise (after the source's, when it had one)."""
        source: str | None = self.source.variant_id
        if self.variant_id is None:
            return source
        return f"{source}.{self.variant_id}" if source else self.variant_id

    @property
    def run_id(self) -> str:
        """Unique within the store: replay, source conversation, variant, replay index."""
        variant = f"/{self.variant_id}" if self.variant_id else ""
        return f"{self.replay_id}/{self.source.conversation_id}{variant}/r{self.replay_index}"


@dataclass(frozen=True)
class RunRecord:
    """What one run came to."""

    run: PlannedRun
    outcome: Outcome
    seconds: float
    tools_served: int = 0  # tool calls answered from the recording
    tools_live: int = 0  # tool calls with no recorded match that ran live
    tools_unmatched: int = 0  # tool calls with no recorded match that failed the run


@dataclass
class ReplayResult:
    """Every finished run, and whether the replay was interrupted before the plan was done."""

    replay_id: str
    planned: int
    records: list[RunRecord] = field(default_factory=list)
    interrupted: bool = False
    exported: bool = True  # every span was handed to the exporter within the flush timeout
    delivery: Delivery | None = None  # spans the collector took and lost (None: not counted, engine runs)

    @property
    def failed(self) -> list[RunRecord]:
        """The runs that ran to their end and whose agent failed (a result, not an error of the replay)."""
        return [r for r in self.records if r.outcome.failed and not r.outcome.stopped]

    @property
    def stopped(self) -> list[RunRecord]:
        """The runs that could not run to their end (the agent raised or was unreachable)."""
        return [r for r in self.records if r.outcome.stopped]

    @property
    def spans_lost(self) -> bool:
        """True when the collector did not take every span (or the flush timed out)."""
        return not self.exported or (self.delivery is not None and self.delivery.lost > 0)

    def tool_counts(self) -> tuple[int, int, int]:
        """Tool calls served from the recording, run live, and unmatched (failing), over every run."""
        return (sum(r.tools_served for r in self.records), sum(r.tools_live for r in self.records),
                sum(r.tools_unmatched for r in self.records))


def default_replay_id() -> str:
    """``replay-<UTC time>``."""
    return time.strftime("replay-%Y%m%dT%H%M%SZ", time.gmtime())


def plan(sources: Sequence[SourceConversation], times: int, replay_id: str, variants: int = 0,
         rewriter: Rewriter | None = None) -> list[PlannedRun]:
    """Every run: each conversation, then each of its ``variants`` rewrites, ``times`` times (replay
    index 0..times-1)."""
    rewriter = rewriter or RuleRewriter()
    out: list[PlannedRun] = []
    for s in sources:
        out.extend(PlannedRun(s, i, replay_id, times=times) for i in range(times))
        for k in range(1, variants + 1):
            turns = _rewrite(s, k, rewriter)
            out.extend(PlannedRun(s, i, replay_id, f"v{k}", turns, times) for i in range(times))
    return out


def _rewrite(source: SourceConversation, k: int, rewriter: Rewriter) -> tuple[str, ...]:
    try:
        turns: tuple[str, ...] = variant_turns(source.turns, k, rewriter)
        return turns
    except Exception as e:  # the rewriting model failed: nothing is replayed
        raise ReplayTargetError(f"conversation {source.conversation_id}: rewriting variant v{k} failed: "
                                f"{describe_error(e)}") from e


def run_one(target: Target, run: PlannedRun, config: ReplayConfig) -> RunRecord:
    """Hold one run inside its labels (and its tool recording); an exception out of the target is a run that
    could not run to its end."""
    labels = config.labels
    recording = ToolRecording(run.source.tool_calls, config.unmatched) if config.tools == "recorded" else None
    info = RunInfo(run.run_id, run.source.conversation_id, run.replay_index, run.variant_id)
    extra: dict[str, str] = {"replay_id": run.replay_id, "source_conversation_id": run.source.conversation_id}
    if run.source.first_trace_id:  # a simulated user's run has no stored source trace
        extra["source_trace_id"] = run.source.first_trace_id
    extra.update((k, v) for k, v in labels.items() if k != "service_version")
    started = time.perf_counter()
    with td.conversation(run.run_id), td.run_labels(
        run_id=run.run_id, scenario_id=run.source.scenario, replay_index=run.replay_label,
        variant_id=run.variant_label, **extra,
    ):
        outcome = _converse(target, run, info, recording)
    seconds = time.perf_counter() - started
    if recording is None:
        return RunRecord(run, outcome, seconds)
    return RunRecord(run, outcome, seconds, recording.served, recording.live, recording.failed)


def _converse(target: Target, run: PlannedRun, info: RunInfo, recording: ToolRecording | None) -> Outcome:
    try:
        if recording is None:
            return target.converse(run.turns, info)
        with td.recorded_tools(recording):
            return target.converse(run.turns, info)
    except Exception as exc:  # a target that does not catch its agent's errors
        record_failure(exc)
        return Outcome((), describe_error(exc), stopped=True)


def replay(
    sources: Sequence[SourceConversation],
    target: Target,
    config: ReplayConfig,
    progress: Progress | None = None,
    exporter: SpanExporter | None = None,
) -> ReplayResult:
    """Hold every planned run (``config.parallel`` at a time, or one engine task per run with
    ``config.engine``), export the spans, flush, summarize.

    ``exporter`` replaces the OTLP exporter (tests). KeyboardInterrupt ends the replay early with
    ``interrupted`` set; the runs that finished are in the result and their spans are flushed.
    """
    replay_id = config.replay_id or default_replay_id()
    runs = plan(sources, config.times, replay_id, config.variants, config.rewriter)
    version = config.labels.get("service_version") or target.service_version
    counting = CountingExporter(exporter or otlp_exporter(config.endpoint, config.protocol))
    td.configure(config.endpoint, service_name=target.service_name, service_version=version,
                 protocol=config.protocol, exporter=counting, schedule_delay_millis=200,
                 set_global=config.set_global)
    result = ReplayResult(replay_id, len(runs))
    engine = config.engine if exporter is None else None  # a test's exporter: threads of this process
    try:
        if engine is not None:
            _run_engine(runs, target, config, result, progress, engine)
        else:
            _run_all(runs, target, config, result, progress)
    finally:
        result.exported = td.force_flush(30_000)
        if not result.exported:
            logger.warning("some spans were not exported within 30 s")
        td.shutdown()
        result.delivery = None if engine is not None else counting.delivery()
    return result


def _run_all(runs: list[PlannedRun], target: Target, config: ReplayConfig, result: ReplayResult,
             progress: Progress | None) -> None:
    pool = ThreadPoolExecutor(max_workers=max(1, config.parallel), thread_name_prefix="replay")
    pending: set[Future[RunRecord]] = {pool.submit(run_one, target, r, config) for r in runs}
    try:
        while pending:
            done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            for future in done:
                if not future.cancelled():
                    result.records.append(future.result())
            if done and progress is not None:
                progress(len(result.records), len(runs))
    except KeyboardInterrupt:
        result.interrupted = True
        for future in pending:
            future.cancel()
        pool.shutdown(wait=True, cancel_futures=True)
        result.records.extend(f.result() for f in pending if f.done() and not f.cancelled())
    finally:
        pool.shutdown(wait=True)
    result.records.sort(key=lambda r: (r.run.source.conversation_id, r.run.variant_id or "", r.run.replay_index))


def _run_engine(runs: list[PlannedRun], target: Target, config: ReplayConfig, result: ReplayResult,
                progress: Progress | None, engine: Engine) -> None:
    """``_run_all`` on an engine: one task per run (``replay_task``), exporting to ``config.endpoint``.

    A run is not retried when its worker dies (a rerun would send a second conversation under the
    same run id): it is a failed run, like an agent that raised.
    """
    try:
        for i, record in engine.map_buckets(replay_task, runs, target, config, retries=0, errors=True):
            if isinstance(record, BaseException):
                record = RunRecord(runs[i], Outcome((), f"engine task failed: {describe_error(record)}", stopped=True), 0.0)
            result.records.append(record)
            if progress is not None:
                progress(len(result.records), len(runs))
    except KeyboardInterrupt:
        result.interrupted = True
    result.records.sort(key=lambda r: (r.run.source.conversation_id, r.run.variant_id or "", r.run.replay_index))


_WORKER_SINK: tuple[str, str, str | None, str] | None = None
"""What this worker process's tracer provider exports to (endpoint, service, version, protocol)."""


def replay_task(run: PlannedRun, target: Target, config: ReplayConfig) -> RunRecord:
    """Hold one run in an engine worker: its provider exports to ``config.endpoint`` (set up once
    per worker), and the run's spans are flushed before the task returns."""
    global _WORKER_SINK
    version = config.labels.get("service_version") or target.service_version
    sink = (config.endpoint, target.service_name, version, config.protocol)
    if sink != _WORKER_SINK:
        td.configure(config.endpoint, service_name=target.service_name, service_version=version,
                     protocol=config.protocol, schedule_delay_millis=200, set_global=config.set_global)
        _WORKER_SINK = sink
    try:
        return run_one(target, run, config)
    finally:
        if not td.force_flush(30_000):
            logger.warning("run %s: some spans were not exported within 30 s", run.run_id)

