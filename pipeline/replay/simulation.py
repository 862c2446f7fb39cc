"""Simulated users against any agent target, with backtracking: CCR and PCR (EDGE §3.1, DESIGN §8).

For every intent (a DFS path of the agent graph), persona and conversation number, a simulated user
talks to the target; after each agent turn the nodes the agent visited (its node spans, seen as they
start: ``gen_ai.node.name`` / ``tracedag.node.name`` / ``graph.node.name`` / ``langgraph_node``,
as ``run_steps`` reads them) are compared with the intended path. An unintended transition ends the
attempt and the conversation restarts from the beginning, up to ``max_backtracks`` times; an
attempt that ends without completing the path (the agent stopped early, or failed) restarts too.

- CCR (conversation completion rate) = share of conversations that completed their intended path
  within their restarts;
- PCR (path completion rate) = mean over conversations of the share of the intended path's
  transitions completed, in order from the start, by the conversation's best attempt (1 when it
  completed).

An agent in another process (behind a URL) is seen through the store: each request carries the W3C
``traceparent`` of the caller's step and the run labels as baggage, the agent's spans continue the
trace and reach the store through its collector, and :class:`StoreNodes` reads its node spans back
by trace id (``remote``), waiting up to ``settle`` seconds a trace for them to land.

Conversations run ``parallel`` at a time; the attempts of one conversation stay in order, so a
deterministic agent gives the same result at any ``parallel``.

Each attempt is one run of the replay runner (``runner.run_one``) with the run labels
``scenario_id`` = intent id, ``variant_id`` = persona, ``replay_index`` = attempt (0 = first try),
``intended_path``, ``simulation_id``, ``conversation_index``, so ``tracedag determinism`` reads them.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter

from tracedag import instrument as td
from tracedag.pipeline.replay.export import CountingExporter, Delivery, otlp_exporter
from tracedag.pipeline.replay.remote import StoreSpans, remote_visits, settled
from tracedag.pipeline.replay.runner import PlannedRun, ReplayConfig, run_one
from tracedag.pipeline.replay.source import SourceConversation
from tracedag.pipeline.replay.targets import Target, TurnTarget
from tracedag.pipeline.replay.users import Intent, Persona

NODE_KEYS = ("langgraph_node", "gen_ai.node.name", "tracedag.node.name", "graph.node.name")
RUN_KEY = "tracedag.run_id"


class User(Protocol):
    """A simulated user: the next message of an attempt, or None when it has nothing more to say."""

    def next_turn(self, intent: Intent, persona: Persona, conversation: int, index: int,
                  replies: Sequence[str]) -> str | None:
        """Turn ``index`` given the agent's ``replies`` so far."""


class NodeSource(Protocol):
    """Where the nodes a run visited are read: this process's spans, or the store."""

    def nodes(self, run_id: str) -> list[str]:
        """The nodes visited so far in ``run_id``, in order."""


@dataclass
class RunSpans:
    """This process's spans of one run: per trace (in the order first seen) its span ids, and the
    outermost node spans ``(trace id, start ns, span id, node)``."""

    traces: dict[str, set[str]] = field(default_factory=dict)
    visits: list[tuple[str, int, str, str]] = field(default_factory=list)
    node_starts: dict[str, int] = field(default_factory=dict)  # every node span id -> its start


class NodeObserver(SpanProcessor):
    """Records, per run id, the graph nodes the agent visits, in the order their spans start (and every
    span of the run, so the store can be asked for the rest of its traces)."""

    def __init__(self) -> None:
        self._runs: dict[str, RunSpans] = defaultdict(RunSpans)
        self._node_spans: set[int] = set()
        self._lock = threading.Lock()

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        """Keep the node of a node span; a node span inside another node span is part of that visit."""
        attrs = span.attributes or {}
        run = attrs.get(RUN_KEY)
        if run is None or span.context is None:
            return
        node = next((attrs[k] for k in NODE_KEYS if k in attrs), None)
        trace_id, span_id = f"{span.context.trace_id:032x}", f"{span.context.span_id:016x}"
        with self._lock:
            spans = self._runs[str(run)]
            spans.traces.setdefault(trace_id, set()).add(span_id)
            if node is None or node in ("__start__", "__end__"):
                return
            self._node_spans.add(span.context.span_id)
            spans.node_starts[span_id] = span.start_time or 0
            if span.parent is not None and span.parent.span_id in self._node_spans:
                return
            spans.visits.append((trace_id, span.start_time or 0, span_id, str(node)))

    def nodes(self, run_id: str) -> list[str]:
        """The nodes visited so far in ``run_id``."""
        with self._lock:
            return [v[3] for v in self._runs[run_id].visits] if run_id in self._runs else []

    def run_spans(self, run_id: str) -> RunSpans:
        """A copy of what was seen of ``run_id``."""
        with self._lock:
            seen = self._runs.get(run_id) or RunSpans()
            return RunSpans({t: set(ids) for t, ids in seen.traces.items()}, list(seen.visits),
                            dict(seen.node_starts))

    def on_end(self, span: ReadableSpan) -> None:
        """Nothing to do when a span ends."""

    def shutdown(self) -> None:
        """Nothing to release."""

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Nothing is buffered."""
        return True


@dataclass
class StoreWaits:
    """How the waits for an agent's spans in the store went."""

    traces: int = 0  # traces waited for
    timed_out: int = 0  # of which no agent span (or not all of them) arrived within the settle time
    absent: bool = False  # no agent span ever arrived: the later waits were skipped


class StoreNodes:
    """Nodes of runs whose agent runs in another process: this process's node spans merged (by start
    time, trace by trace) with the agent's, read from the store once its part of each trace is in
    (``remote.settled``), waiting at most ``settle`` seconds a trace."""

    def __init__(self, observer: NodeObserver, spans: StoreSpans, settle: float, poll: float = 0.05) -> None:
        self.observer, self.spans, self.settle, self.poll = observer, spans, settle, poll
        self.waits = StoreWaits()
        self._done: dict[str, list[tuple[int, str, str]]] = {}
        self._seen_remote = False
        self._lock = threading.Lock()

    def nodes(self, run_id: str) -> list[str]:
        """The nodes ``run_id`` visited, here and in the agent's process."""
        seen = self.observer.run_spans(run_id)
        out: list[str] = []
        for trace_id, local_ids in seen.traces.items():
            local = [(start, sid, node) for t, start, sid, node in seen.visits if t == trace_id]
            out.extend(node for _, _, node in sorted(local + self._remote(trace_id, local_ids, seen.node_starts)))
        return out

    def _remote(self, trace_id: str, local_ids: set[str], node_starts: dict[str, int]) -> list[tuple[int, str, str]]:
        with self._lock:
            if trace_id in self._done:
                return self._done[trace_id]
            if self.waits.absent:
                return []
        deadline = time.monotonic() + self.settle
        while True:
            stored = self.spans.fetch([trace_id])[trace_id]
            arrived = settled(stored, local_ids)
            if arrived or time.monotonic() >= deadline:
                break
            time.sleep(self.poll)
        self.spans.release([trace_id])
        visits: list[tuple[int, str, str]] = remote_visits(stored, local_ids, node_starts)
        with self._lock:
            self.waits.traces += 1
            self._seen_remote = self._seen_remote or arrived
            if not arrived:
                self.waits.timed_out += 1
                self.waits.absent = not self._seen_remote
            self._done[trace_id] = visits
        return visits


def progress_of(nodes: Sequence[str], path: Sequence[str]) -> tuple[int, bool]:
    """Transitions of ``path`` completed in order from its start, and whether one was unintended."""
    if not nodes:
        return 0, False
    if nodes[0] != path[0]:
        return 0, True
    done = 0
    for i in range(1, min(len(nodes), len(path))):
        if nodes[i] != path[i]:
            return done, True
        done += 1
    return done, False


@dataclass(frozen=True)
class Attempt:
    """One try of a conversation: the nodes visited, the transitions completed, the error if it failed."""

    nodes: tuple[str, ...]
    completed_transitions: int
    complete: bool
    error: str | None = None
    run_id: str = ""
    stopped: bool = False  # the run could not run to its end (the agent raised or was unreachable)


@dataclass
class Conversation:
    """One simulated conversation: an intent played by a persona, with its attempts."""

    intent: Intent
    persona: Persona
    index: int
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def completed(self) -> bool:
        """True when an attempt completed the intended path (CCR counts it)."""
        return any(a.complete for a in self.attempts)

    @property
    def path_completion(self) -> float:
        """The best attempt's share of the intended transitions (PCR averages it)."""
        if self.completed:
            return 1.0
        total = self.intent.transitions
        best = max((a.completed_transitions for a in self.attempts), default=0)
        return best / total if total else 0.0

    @property
    def restarts(self) -> int:
        """Restarts used (attempts after the first)."""
        return max(0, len(self.attempts) - 1)


@dataclass
class SimulationResult:
    """Every conversation, and how long the simulation took."""

    simulation_id: str
    conversations: list[Conversation] = field(default_factory=list)
    seconds: float = 0.0
    exported: bool = True
    planned: int = 0  # conversations planned
    interrupted: bool = False  # Ctrl-C: the conversations that finished are kept
    waits: StoreWaits | None = None  # with nodes read from the store
    delivery: Delivery | None = None  # spans the collector took and lost

    @property
    def stopped(self) -> list[tuple[Conversation, Attempt]]:
        """The runs that could not run to their end, with their conversation."""
        return [(c, a) for c, a in self.failed if a.stopped]

    @property
    def spans_lost(self) -> bool:
        """True when the collector did not take every span (or the flush timed out)."""
        return not self.exported or (self.delivery is not None and self.delivery.lost > 0)

    @property
    def runs(self) -> int:
        """Attempts held (each one a stored run)."""
        return sum(len(c.attempts) for c in self.conversations)

    @property
    def failed(self) -> list[tuple[Conversation, Attempt]]:
        """The runs that failed (the agent failed, raised or could not be reached), with their conversation."""
        return [(c, a) for c in self.conversations for a in c.attempts if a.error is not None]


def rates(conversations: Sequence[Conversation]) -> tuple[float, float]:
    """CCR and PCR of ``conversations`` (0, 0 when there are none)."""
    if not conversations:
        return 0.0, 0.0
    n = len(conversations)
    return sum(c.completed for c in conversations) / n, sum(c.path_completion for c in conversations) / n


@dataclass(frozen=True)
class SimulationConfig:
    """How many conversations per intent and persona, how many restarts, where the spans go."""

    endpoint: str
    conversations: int = 1
    max_backtracks: int = 2
    simulation_id: str = "usersim"
    exporter: SpanExporter | None = None
    set_global: bool = True
    parallel: int = 1  # conversations held at the same time (restarts of one conversation stay in order)
    nodes_from: Path | None = None  # read the agent's node spans from this store (an agent in another process)
    settle: float = 15.0  # seconds to wait, a trace, for the agent's spans to reach the store


class _Dialogue:
    """The user's turns of one attempt, produced lazily: before each turn after the first, the nodes the
    agent visited are checked, and the attempt stops at an unintended transition or a completed path."""

    def __init__(self, user: User, conv: Conversation, run_id: str, observer: NodeSource,
                 replies: list[str]) -> None:
        self.user, self.conv, self.run_id, self.observer, self.replies = user, conv, run_id, observer, replies

    def __iter__(self) -> Iterator[str]:
        index = 0
        while True:
            if index:
                done, deviated = progress_of(self.observer.nodes(self.run_id), self.conv.intent.path)
                if deviated or done >= self.conv.intent.transitions:
                    return
            text = self.user.next_turn(self.conv.intent, self.conv.persona, self.conv.index, index, self.replies)
            if text is None:
                return
            index += 1
            yield text


def _tapped(target: Target, replies: list[str]) -> Target:
    """A turn-by-turn target whose replies are also kept in ``replies`` (the simulated user reads them)."""
    if not isinstance(target, TurnTarget):
        return target
    turn = target.turn

    def tap(history: list[dict[str, Any]]) -> str:
        reply = str(turn(history))
        replies.append(reply)
        return reply

    return dataclasses.replace(target, turn=tap)


def hold(target: Target, user: User, conv: Conversation, config: SimulationConfig, observer: NodeSource) -> Conversation:
    """Every attempt of one conversation: restart from the beginning until it completes or runs out of restarts."""
    source = SourceConversation(conv.intent.intent_id, "", conv.intent.asks)
    replay_config = ReplayConfig(endpoint=config.endpoint, set_global=config.set_global)
    for attempt in range(config.max_backtracks + 1):
        replies: list[str] = []
        planned = PlannedRun(source, attempt, f"{config.simulation_id}/c{conv.index}", conv.persona.name)
        dialogue = _Dialogue(user, conv, planned.run_id, observer, replies)
        # lazy: the runner only iterates the turns, so the user can stop after an unintended transition
        planned = dataclasses.replace(planned, variant_turns=cast("tuple[str, ...]", dialogue))
        with td.run_labels(intended_path=conv.intent.path, simulation_id=config.simulation_id,
                           conversation_index=conv.index):
            record = run_one(_tapped(target, replies), planned, replay_config)
        nodes = observer.nodes(planned.run_id)
        done, _ = progress_of(nodes, conv.intent.path)
        complete = len(nodes) >= len(conv.intent.path) and done >= conv.intent.transitions
        conv.attempts.append(Attempt(tuple(nodes), done, complete, record.outcome.error, planned.run_id,
                                     record.outcome.stopped))
        if complete:
            break
    return conv


def simulate_users(target: Target, user: User, intents: Sequence[Intent], personas: Sequence[Persona],
                   config: SimulationConfig, progress: Callable[[int, int], None] | None = None) -> SimulationResult:
    """Hold every conversation (intents x personas x ``config.conversations``, ``config.parallel`` at a
    time), export the spans, summarize. Ctrl-C ends it early with ``interrupted`` set: the running
    conversations finish, and the finished ones are in the result."""
    observer = NodeObserver()
    counting = CountingExporter(config.exporter or otlp_exporter(config.endpoint))
    provider = td.configure(config.endpoint, service_name=target.service_name, service_version=target.service_version,
                            exporter=counting, schedule_delay_millis=200, set_global=config.set_global)
    provider.add_span_processor(observer)
    store = StoreSpans(config.nodes_from) if config.nodes_from is not None else None
    source: NodeSource = StoreNodes(observer, store, config.settle) if store is not None else observer
    plan = [Conversation(i, p, n) for i in intents for p in personas for n in range(config.conversations)]
    result = SimulationResult(config.simulation_id, planned=len(plan))
    started = time.perf_counter()
    try:
        result.interrupted = _hold_all(plan, lambda c: hold(target, user, c, config, source), config.parallel,
                                       result, progress)
    finally:
        result.seconds = time.perf_counter() - started
        result.exported = td.force_flush(30_000)
        td.shutdown()
        result.delivery = counting.delivery()
        if store is not None:
            store.close()
    order = {id(c): k for k, c in enumerate(plan)}
    result.conversations.sort(key=lambda c: order[id(c)])
    result.waits = source.waits if isinstance(source, StoreNodes) else None
    return result


def _hold_all(plan: Sequence[Conversation], one: Callable[[Conversation], Conversation], parallel: int,
              result: SimulationResult, progress: Callable[[int, int], None] | None) -> bool:
    """Every conversation of ``plan`` through ``one``, ``parallel`` at a time; True when interrupted."""
    pool = ThreadPoolExecutor(max_workers=max(1, parallel), thread_name_prefix="usersim")
    pending: set[Future[Conversation]] = {pool.submit(one, c) for c in plan}
    try:
        while pending:
            done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            result.conversations.extend(f.result() for f in done)
            if done and progress is not None:
                progress(len(result.conversations), len(plan))
    except KeyboardInterrupt:
        for future in pending:
            future.cancel()
        pool.shutdown(wait=True, cancel_futures=True)
        result.conversations.extend(f.result() for f in pending if f.done() and not f.cancelled())
        return True
    finally:  # a conversation that raised (not a failed run: the user's model failed) stops the others
        for future in pending:
            future.cancel()
        pool.shutdown(wait=True)
    return False
