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
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter

from tracedag import instrument as td
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


class NodeObserver(SpanProcessor):
    """Records, per run id, the graph nodes the agent visits, in the order their spans start."""

    def __init__(self) -> None:
        self._nodes: dict[str, list[str]] = defaultdict(list)
        self._node_spans: set[int] = set()
        self._lock = threading.Lock()

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        """Keep the node of a node span; a node span inside another node span is part of that visit."""
        attrs = span.attributes or {}
        node = next((attrs[k] for k in NODE_KEYS if k in attrs), None)
        run = attrs.get(RUN_KEY)
        if node is None or run is None or node in ("__start__", "__end__"):
            return
        with self._lock:
            if span.context is not None:
                self._node_spans.add(span.context.span_id)
            if span.parent is not None and span.parent.span_id in self._node_spans:
                return
            self._nodes[str(run)].append(str(node))

    def nodes(self, run_id: str) -> list[str]:
        """The nodes visited so far in ``run_id``."""
        with self._lock:
            return list(self._nodes.get(run_id, ()))

    def on_end(self, span: ReadableSpan) -> None:
        """Nothing to do when a span ends."""

    def shutdown(self) -> None:
        """Nothing to release."""

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Nothing is buffered."""
        return True


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

    @property
    def runs(self) -> int:
        """Attempts held (each one a stored run)."""
        return sum(len(c.attempts) for c in self.conversations)


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


class _Dialogue:
    """The user's turns of one attempt, produced lazily: before each turn after the first, the nodes the
    agent visited are checked, and the attempt stops at an unintended transition or a completed path."""

    def __init__(self, user: User, conv: Conversation, run_id: str, observer: NodeObserver,
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


def hold(target: Target, user: User, conv: Conversation, config: SimulationConfig, observer: NodeObserver) -> None:
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
        conv.attempts.append(Attempt(tuple(nodes), done, complete, record.outcome.error))
        if complete:
            return


def simulate_users(target: Target, user: User, intents: Sequence[Intent], personas: Sequence[Persona],
                   config: SimulationConfig, progress: Callable[[int, int], None] | None = None) -> SimulationResult:
    """Hold every conversation (intents x personas x ``config.conversations``), export the spans, summarize."""
    observer = NodeObserver()
    provider = td.configure(config.endpoint, service_name=target.service_name, service_version=target.service_version,
                            exporter=config.exporter, schedule_delay_millis=200, set_global=config.set_global)
    provider.add_span_processor(observer)
    plan = [Conversation(i, p, n) for i in intents for p in personas for n in range(config.conversations)]
    result = SimulationResult(config.simulation_id)
    started = time.perf_counter()
    try:
        for k, conv in enumerate(plan):
            hold(target, user, conv, config, observer)
            result.conversations.append(conv)
            if progress is not None:
                progress(k + 1, len(plan))
    finally:
        result.seconds = time.perf_counter() - started
        result.exported = td.force_flush(30_000)
        td.shutdown()
    return result
