"""``tracedag collect`` in-process: the collector's receivers plus the stages that keep up with them.

The only module that imports both ``tracedag.collector`` (the request path) and the stages.
``start_collector(CollectorConfig(data=...))`` starts the receivers (``collector.server``), then
the spool converters (child processes, or a thread) and, with ``build``, the live analysis: every
``build_interval`` seconds the complete traces are built and their steps scored (rules and the
evaluations in the spans), so a root cause is queryable seconds after its trace completes (the
named queries compute it from their SQL until it is stored). The named queries' results are stored
(``score.live_store``) by a thread of its own, beside the round loop: each pass takes whatever was scored
since the last (a part of at most ``materialize_part`` traces, whole conversations), copies those traces'
rows between two rounds under the scorer's lock, computes the results without a lock, and writes them under
that lock (the part's spans after the round lock is released: only the converter writes them); storing costs
a fixed ~1-2 s of CPU a pass whatever its size, which inside the loop held every later trace back. A failing
pass is logged and retried with a growing pause (``Backoff``). A configured LLM judge grades in a thread of
its own, at most ``judge.max_steps`` steps a round, so it never holds the rules back. It returns
a ``RunningCollector`` with the bound ports, ``flush()`` (seal the spool and convert everything acknowledged so
far, synchronously) and ``stop(grace_seconds)`` (drain in-flight requests, seal, convert what is left, release
the store).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracedag.collector.metrics import REGISTRY
from tracedag.collector.server import ReceiverConfig, Receivers
from tracedag.collector.spoolfmt import DONE_RETENTION_SECONDS
from tracedag.pipeline.ingest.processes import ConverterProcess
from tracedag.pipeline.store.manifests import KeepLocal, publish
from tracedag.pipeline.store.remote import remote_of
from tracedag.schemas.errors import TracedagError
from tracedag.schemas.fsio import file_lock
from tracedag.schemas.layout import JUDGE_LOCK, state_file

if TYPE_CHECKING:  # the stages are imported where they run, so the receivers' process stays small
    from tracedag.pipeline.ingest.segments import SpoolConverter
    from tracedag.pipeline.score import JudgeConfig
    from tracedag.pipeline.score.live_store import LiveStore
    from tracedag.pipeline.store.gc import GcStats

logger = logging.getLogger(__name__)

TIMELINE_ENV = "TRACEDAG_LIVE_TIMELINE"
"""A file each live round and store pass appends one JSON line of its wall-clock times to (debugging the live
latency, ``bench/live.py --timeline``); unset (the default): nothing is written or timed."""

LIVE_GC_SECONDS = 10.0
"""How often the live collector collects superseded rows and merges small files of the derived tables, by a thread
of its own beside the rounds (``store.swap.collect_beside``: the new files are written while rounds go on; a round
that collected itself took 1.3-3.2 s instead of ~0.5 at 10k spans/s, and held every trace waiting for the next)."""

STORE_PERIOD = 3.0
"""A live store pass (``store_once``) that stored something starts the next no sooner than this many seconds after it
started. A pass costs ~0.35 s of CPU whatever its size (the shared macros, the failure graph and the six queries
planned; +0.16 ms a trace): one a round (~2 s apart at 10k spans/s) spent ~0.18 of a core on that alone, beside the
rounds. Polls compute what is not stored yet meanwhile, and keep it, so a trace's root cause is queryable as soon."""


@dataclass(frozen=True)
class CollectorConfig(ReceiverConfig):
    """The receivers' settings plus conversion and continuous build."""

    convert: bool = True
    convert_process: bool = False  # convert in child processes (off this interpreter's GIL)
    convert_interval: float = 0.25
    spool_retention: float = DONE_RETENTION_SECONDS  # seconds converted segments stay in spool/done/
    build: bool = False  # build and score continuously (the live analysis)
    build_idle_seconds: float = 30.0  # a trace without its root span is complete after this quiet time
    build_grace_seconds: float = 1.0  # a trace whose root span is in is complete after this quiet time
    build_interval: float = 1.0
    materialize_part: int = 20_000  # traces (whole conversations) one pass of the store copies at most (its copy holds
    # the rounds back: ~0.3 s of CPU per 1,000 traces; a smaller part leaves a backlog the polls compute from the SQL)
    judge: JudgeConfig | None = None  # grade steps with an LLM judge too (asynchronous, bounded)
    judge_interval: float = 10.0
    publish_interval: float = 1.0  # with an object store: upload new files and publish a manifest this often
    keep_local_seconds: float = 24 * 3600.0  # with an object store: local copies of uploaded spans kept this long


class RoundFailures:
    """What one background loop says of its failed rounds: a new failure in full, the same one again at
    most every ``every`` seconds with its count, and once when a round works again. A store that
    refuses every round (``StoreLost``) used to log the same traceback every second."""

    def __init__(self, what: str, every: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.what, self.every, self.clock = what, every, clock
        self.text: str | None = None
        self.count = 0
        self._said = 0.0

    def failed(self, exc: BaseException) -> None:
        text = f"{type(exc).__name__}: {exc}"
        if text != self.text:
            self.text, self.count, self._said = text, 1, self.clock()
            if isinstance(exc, TracedagError):  # a message written for the user: no traceback
                logger.error("%s: %s", self.what, exc)
            else:
                logger.exception("%s; retrying", self.what)
            return
        self.count += 1
        if self.clock() - self._said >= self.every:
            self._said = self.clock()
            logger.error("%s, still (%d rounds in a row): %s", self.what, self.count, text)

    def succeeded(self) -> None:
        if self.text is not None:
            logger.info("%s: working again after %d failed round(s)", self.what, self.count)
            self.text, self.count = None, 0


class Backoff:
    """The pause before a failed loop's next try: ``first`` seconds, doubled each failure in a row up to ``most``,
    back to none once it works."""

    def __init__(self, first: float = 1.0, most: float = 30.0) -> None:
        self.first, self.most = first, most
        self.pause = 0.0

    def failed(self) -> float:
        """One more failure: return the pause before the next try."""
        self.pause = min(self.most, self.pause * 2 if self.pause else self.first)
        return self.pause

    def succeeded(self) -> None:
        self.pause = 0.0


class RunningCollector:
    """A started collector; see ``start_collector``."""

    def __init__(self, config: CollectorConfig) -> None:
        self.config = config
        self.receivers = Receivers(config)
        self.data = self.receivers.data
        self.spool = self.receivers.spool
        self.admission = self.receivers.admission
        self.ingestor = self.receivers.ingestor
        self.lock = self.receivers.lock
        self._stop = threading.Event()
        self._convert_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._converter: SpoolConverter | None = None
        self._child: ConverterProcess | None = None
        self._stopped = False
        self._built = threading.Event()  # a round built something since the last collection
        # the round loop holds it from a build to its scoring: between rounds every build is scored
        self._round_lock = threading.Lock()
        self._unscored = True  # a build may be unscored (before the first round, or after a round failed midway)
        self._scored = threading.Event()  # a round scored something: the store has work
        self._store: LiveStore | None = None
        self._timeline = os.environ.get(TIMELINE_ENV) or None

    @property
    def http_port(self) -> int:
        """The bound OTLP/HTTP port (0 when disabled)."""
        return self.receivers.http_port

    @property
    def grpc_port(self) -> int:
        """The bound OTLP/gRPC port (0 when disabled)."""
        return self.receivers.grpc_port

    def readiness(self) -> str | None:
        """Return why the collector is not ready, or None when it is."""
        return self.receivers.readiness()

    def start(self) -> RunningCollector:
        """Start the receivers (a port in use stops here, before any converter), then the stages."""
        self.receivers.start()
        cfg = self.config
        if cfg.convert and cfg.convert_process:
            self._child = ConverterProcess(self.data, cfg.convert_interval, retention=cfg.spool_retention)
            self._child.start()
            REGISTRY.add_source(self._child.metrics_text)
            self._spawn("converter-supervisor", self._supervise)
        elif cfg.convert:
            self._converter = _spool_converter(self.data, cfg.spool_retention)
            self._spawn("spool-converter", self._convert_loop)
        if cfg.build:
            _load_stages()  # here, not in the two threads at once (a package imported by two threads half-exists)
            self._spawn("live-analysis", self._analysis_loop)
            self._spawn("live-store", self._store_loop)
            self._spawn("live-gc", self._gc_loop)
        if cfg.build and cfg.judge is not None:
            self._spawn("live-judge", self._judge_loop)
        if remote_of(self.data) is not None:
            self._spawn("publisher", self._publish_loop)
        logger.info("collector up: http=%s grpc=%s data=%s", self.http_port, self.grpc_port, self.data)
        return self

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    # -- background work ---------------------------------------------------------------

    def convert_once(self) -> Any:
        """Convert every sealed segment now (serialized with the background loop)."""
        if self._converter is None:
            return None
        with self._convert_lock:
            return self._converter.run_once()

    def _convert_loop(self) -> None:
        failures = RoundFailures("spool conversion round failed")
        while not self._stop.wait(self.config.convert_interval):
            try:
                self.convert_once()
            except Exception as exc:
                failures.failed(exc)
            else:
                failures.succeeded()

    def _supervise(self) -> None:
        while not self._stop.wait(1.0):
            if self._child is not None:
                self._child.ensure_alive()

    def analyze_once(self) -> int:
        """Build the traces that became complete and score their steps; return the traces built."""
        from tracedag.pipeline.dag import build_store
        from tracedag.pipeline.score.runner import LiveRound, score_store
        from tracedag.pipeline.store.gc import GcSettings

        cfg = self.config
        times = [time.time(), time.thread_time()] if self._timeline else None
        with self._round_lock:
            if times is not None:
                times.append(time.time())
            leftover = self._unscored  # the first round, or one that failed between its build and its scoring
            self._unscored = True  # until this round's build is scored: the store copies nothing meanwhile
            # superseded rows and small files are collected beside the rounds (collect_once), never by one
            built = build_store(self.data, idle_seconds=cfg.build_idle_seconds,
                                grace_seconds=cfg.build_grace_seconds, gc=GcSettings(enabled=False))
            if built.traces_built:
                self._built.set()
            if times is not None:
                times.append(time.time())
            if built.traces_built or leftover:
                # rules and evaluations: no network, seconds behind the build, reading what it just wrote
                score_store(self.data, live=LiveRound(built.build_id if built.traces_built else None,
                                                        built.received_from, materialize=False))
            self._unscored = False
        if built.traces_built or leftover:
            self._scored.set()
        if times is not None and built.traces_built:
            self._note({"round": built.build_id, "traces": built.traces_built, "start": times[0], "locked": times[2],
                        "built": times[3], "scored": time.time(), "cpu": time.thread_time() - times[1]})
        return built.traces_built

    def _note(self, line: dict[str, Any]) -> None:
        """Append ``line`` to the timeline file (``TIMELINE_ENV``; only when set)."""
        if self._timeline is not None:
            with open(self._timeline, "a") as out:
                out.write(json.dumps(line) + "\n")

    def store_once(self) -> int:
        """One pass of the store (``score.live_store``): the first part of the scored traces without stored results,
        copied between two rounds under the scorer's lock, computed without a lock, written under it; return the
        traces stored (0: none waits, or a round has yet to score its build). Every part, when the SQL or the human
        labels changed since the last stored round (``materialize``, under the scorer's lock)."""
        from tracedag.pipeline.score.live_store import LiveStore
        from tracedag.pipeline.score.runner import materialize_later
        from tracedag.pipeline.score.writes import score_lock

        if self._store is None:
            self._store = LiveStore(self.data, self.config.materialize_part)
        t0 = time.perf_counter()
        with self._round_lock:
            if self._unscored:
                return 0
            with score_lock(self.data):
                copied = self._store.copy()
        if copied.full:
            with self._round_lock:  # every trace again, in parts: rare (new SQL or labels), holds the rounds back
                stats = materialize_later(self.data, [], None)
            return 0 if stats is None else int(stats.traces)
        if copied.state is None:
            return 0
        t1 = time.perf_counter()
        self._store.copy_spans(copied)  # no lock: only the converter writes spans
        results = self._store.compute(copied)
        if self._stop.is_set():
            return 0  # nothing written: the part stays without state rows, the next pass or collector stores it
        t2 = time.perf_counter()
        with score_lock(self.data):
            stats = self._store.write(copied, results)
        if self._timeline is not None:
            now, wall = time.perf_counter(), time.time()
            self._note({"store": stats.traces, "start": wall - (now - t0), "copied": wall - (now - t1), "written": wall})
        logger.info("stored the named queries' results of %d traces%s: copied in %.2fs (the rounds held), computed "
                    "in %.2fs, written in %.2fs", stats.traces, " (more wait)" if copied.more else "", t1 - t0,
                    t2 - t1, time.perf_counter() - t2)
        if copied.more:
            self._scored.set()  # more waits: the next pass at once
        return stats.traces

    def collect_once(self) -> GcStats | None:
        """Collect superseded rows and merge small files of the derived tables when a round built something since
        the last time (``store.swap.collect_beside``: rounds go on meanwhile); None: nothing was built."""
        from tracedag.pipeline.store.swap import collect_beside

        if not self._built.is_set():
            return None
        self._built.clear()
        stats = collect_beside(self.data)
        logger.debug("live collection: %s", stats)
        return stats

    def _gc_loop(self) -> None:
        _lower_priority()  # the rounds, the store and the readers first; the collection takes what they leave
        while not self._stop.wait(LIVE_GC_SECONDS):
            try:
                self.collect_once()
            except Exception:
                self._built.set()  # its work is still due
                logger.exception("live collection of superseded rows and small files failed; again in %gs",
                                 LIVE_GC_SECONDS)

    def materialize_once(self) -> int:
        """Store every part waiting now (``store_once`` until none waits); return the traces stored."""
        done = 0
        while n := self.store_once():
            done += n
        return done

    def _store_loop(self) -> None:
        failures = RoundFailures("storing the named queries' results failed (they compute from their SQL meanwhile)")
        backoff = Backoff()
        try:
            while not self._stop.is_set():
                self._scored.clear()
                started = time.monotonic()
                try:
                    stored = self.store_once()
                except Exception as exc:
                    if self._stop.is_set():
                        return  # interrupted by stop(): nothing of the part is written
                    failures.failed(exc)
                    if self._stop.wait(backoff.failed()):
                        return
                    continue
                failures.succeeded()
                backoff.succeeded()
                if stored and self._stop.wait(max(0.0, STORE_PERIOD - (time.monotonic() - started))):
                    return
                while not self._scored.wait(0.5):
                    if self._stop.is_set():
                        return
        finally:
            if self._store is not None:
                self._store.close()

    def _analysis_loop(self) -> None:
        wait = self.config.build_interval
        while not self._stop.wait(wait):
            again, wait = wait == 0.0, self.config.build_interval
            try:
                self.analyze_once()
            except Exception as exc:
                if _file_went_away(exc) and not again:  # a compaction swapped a partition under the round
                    logger.info("live analysis round met a file compacted away (%s); again at once", exc)
                    wait = 0.0  # once: the next failure waits the interval
                    continue
                logger.exception("live analysis round (build, score) failed; retrying")

    def judge_once(self) -> int:
        """One bounded judge round over the scored steps not graded yet; return the rows written."""
        from tracedag.pipeline.score import ScoreStats
        from tracedag.pipeline.score.runner import score_judge
        from tracedag.pipeline.store.views import connect

        assert self.config.judge is not None
        with file_lock(state_file(self.data, JUDGE_LOCK), wait=False) as free:
            if not free:
                return 0
            stats = ScoreStats()
            con = connect(self.data)
            try:
                score_judge(self.data, con, self.config.judge, stats, lambda phase, n, total: None)
            finally:
                con.close()
            return int(stats.rows_by_source["judge"])

    def _judge_loop(self) -> None:
        while not self._stop.wait(self.config.judge_interval):
            try:
                self.judge_once()
            except Exception:
                logger.exception("live judge round failed; retrying")

    def publish_once(self) -> Any:
        """With an object store: upload the files converted since the last call and publish them."""
        stats = publish(self.data, keep_local=KeepLocal(self.config.keep_local_seconds))
        if stats is not None and stats.errors:
            logger.warning("publishing to the store: %d error(s), retried next round; first: %s",
                           len(stats.errors), stats.errors[0])
        return stats

    def _publish_loop(self) -> None:
        failures = RoundFailures("publishing to the object store failed; the files stay here and go next round")
        while not self._stop.wait(self.config.publish_interval):
            try:
                self.publish_once()
            except Exception as exc:
                failures.failed(exc)
            else:
                failures.succeeded()

    # -- public control ----------------------------------------------------------------

    def flush(self) -> None:
        """Seal the spool and convert everything acknowledged so far, synchronously."""
        self.receivers.flush()
        if self._child is not None:
            self._child.flush()
        self.convert_once()
        if remote_of(self.data) is not None:
            self.publish_once()

    def stop(self, grace_seconds: float = 10.0) -> None:
        """Drain in-flight requests, seal the spool, run a final conversion, release the store."""
        if self._stopped:
            return
        self._stopped = True
        self.receivers.stop(grace_seconds)
        self._stop.set()
        self._scored.set()
        if self._store is not None:
            self._store.interrupt()  # a pass computing stops here (nothing of it is written)
        for thread in self._threads:
            thread.join(grace_seconds + 30)
        if self._child is not None:
            self._child.stop(grace_seconds + 60)
            REGISTRY.remove_source(self._child.metrics_text)
            if self._child.pending():  # the child is gone: finish here
                self._converter = _spool_converter(self.data, self.config.spool_retention)
        try:
            self.convert_once()
        except Exception:
            logger.exception("final conversion failed; the spool keeps the data for the next start")
        if remote_of(self.data) is not None:
            try:
                self.publish_once()
            except Exception:
                logger.exception("final publish failed; the files stay in the work directory for the next start")
        self.receivers.release()
        logger.info("collector stopped")


def _file_went_away(exc: BaseException) -> bool:
    """True for a read that listed a Parquet file which a compaction then removed."""
    text = str(exc)
    return isinstance(exc, FileNotFoundError) or "Cannot open file" in text or "No such file" in text


GC_NICE = 10
"""How much lower the live collection's thread runs than the collector's other threads (Linux: a thread's nice value)."""


def _lower_priority() -> None:
    """Lower the calling thread's CPU priority by ``GC_NICE`` (Linux only: elsewhere ``setpriority`` would lower the
    whole process)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            tid = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + GC_NICE)


def _load_stages() -> None:
    """Import the modules the live analysis and its store run (``analyze_once``, ``store_once``)."""
    import tracedag.pipeline.dag
    import tracedag.pipeline.score.live_store
    import tracedag.pipeline.score.runner
    import tracedag.pipeline.store.gc
    import tracedag.pipeline.store.swap  # noqa: F401


def _spool_converter(data: Path, retention: float) -> SpoolConverter:
    """An in-process converter (imported here: with converter processes the receivers never load it)."""
    from tracedag.pipeline.ingest.segments import SpoolConverter

    return SpoolConverter(data, done_retention=retention)


def start_collector(config: CollectorConfig) -> RunningCollector:
    """Start a collector in this process (threads, and converter child processes) and return it."""
    return RunningCollector(config).start()
