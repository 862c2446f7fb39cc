"""Drive the example agent through its conversation paths, N times, exporting spans over OTLP.

Each path of the agent graph (from ``tracedag paths``) becomes a scenario: scripted user turns
that lead a well-behaved agent along it. Every scenario runs as exact replays (``variant_id``
``base``, ``replay_index`` 0..n-1) and as variants (the same task rephrased, with other days and
times: ``v1``, ``v2``...), once per agent variant (constrained, permissive). Every span carries the
run labels ``tracedag.run_id`` (one per conversation, as ``tracedag determinism`` groups runs),
``scenario_id``, ``replay_index``, ``variant_id`` (absent on exact replays), ``intended_path``,
and ``tracedag.simulation_id`` naming the whole simulation.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from opentelemetry.sdk.trace.export import SpanExporter

from tracedag import instrument as td
from tracedag.pipeline.demo.agent import booking_graph as graph
from tracedag.pipeline.demo.agent.booking_agent import BookingAgent, ConversationResult
from tracedag.pipeline.demo.agent.tweaks import Tweaks

logger = logging.getLogger(__name__)

CALENDAR_FAULTS = ("CalendarTimeout", "CalendarUnavailable")

# Phrasings per variant: index 0 is the base scenario, the others are its variants.
PHRASES: dict[str, tuple[str, ...]] = {
    "book": (
        "Hi, I'd like to book a tennis court.",
        "Can I reserve a court to play tennis?",
        "Hello! Please book me a court for a match.",
    ),
    "info": ("What are your opening hours?", "When is the club open?", "What does a court cost per hour?"),
    "partial": ("Saturday.", "Sometime next tuesday.", "On friday, please."),
    "complete": ("Saturday at 18:00.", "Next tuesday at 7pm.", "Friday at 09:30, please."),
    "accept": ("Yes, please book it.", "Sounds good, go ahead.", "Sure, book it."),
    "decline": ("No thanks, maybe later.", "No, that does not suit me.", "No."),
}


@dataclass(frozen=True)
class Scenario:
    """One conversation path with the scripted user turns that lead along it."""

    scenario_id: str
    intended_path: tuple[str, ...]

    def user_turns(self, variant_index: int) -> list[str]:
        """The user's messages for this path, phrased as variant ``variant_index`` (0 = base)."""
        pick = variant_index % len(PHRASES["book"])
        turns: list[str] = []
        path = self.intended_path
        for i, node in enumerate(path):
            nxt = path[i + 1] if i + 1 < len(path) else None
            kind = _turn_kind(node, nxt)
            if kind is not None:
                turns.append(PHRASES[kind][pick])
        return turns


def _turn_kind(node: str, nxt: str | None) -> str | None:
    if node == "router":
        return "info" if nxt == "club_info" else "book"
    if node == "ask_details":
        return "partial" if nxt == "ask_details" else "complete"
    if node == "propose_slot":
        return "accept" if nxt == "book_court" else "decline"
    return None


def scenarios(paths: Sequence[Sequence[str]]) -> list[Scenario]:
    """Scenarios from agent-graph paths (ids ``p01``, ``p02``... in path order)."""
    return [Scenario(f"p{i + 1:02d}", tuple(p)) for i, p in enumerate(paths)]


@dataclass(frozen=True)
class SimulationConfig:
    """What to simulate and where to send the spans."""

    endpoint: str
    protocol: td.setup.Protocol = "http/protobuf"
    seed: int = 7
    replays: int = 3
    variants: int = 2
    fault_rate: float = 0.25
    noise: float = 0.04
    latency_scale: float = 1.0
    agent_variants: tuple[graph.Variant, ...] = graph.VARIANTS
    simulation_id: str | None = None
    service_name: str = "court-booking-agent"
    service_version: str = "1.0"
    tweaks: Tweaks = field(default_factory=Tweaks)


@dataclass(frozen=True)
class Run:
    """One planned conversation: which agent, scenario, variant and replay."""

    agent_variant: graph.Variant
    scenario: Scenario
    variant_index: int
    replay_index: int

    @property
    def variant_id(self) -> str | None:
        """None for exact replays, ``v1``, ``v2``... for rephrased variants."""
        return None if self.variant_index == 0 else f"v{self.variant_index}"

    @property
    def conversation_id(self) -> str:
        """A conversation id unique within the simulation."""
        variant = self.variant_id or "base"
        return f"{self.agent_variant}-{self.scenario.scenario_id}-{variant}-r{self.replay_index}"


@dataclass
class SimulationResult:
    """What happened in a simulation."""

    simulation_id: str
    runs: int = 0
    failed: int = 0
    calendar_faults: int = 0
    results: list[tuple[Run, ConversationResult]] = field(default_factory=list)


def plan(config: SimulationConfig, scenario_list: Sequence[Scenario]) -> list[Run]:
    """Every conversation to hold: agents x scenarios x (base + variants) x replays."""
    return [
        Run(agent, scenario, v, r)
        for agent in config.agent_variants
        for scenario in scenario_list
        for v in range(config.variants + 1)
        for r in range(config.replays)
    ]


def run_one(config: SimulationConfig, run: Run, simulation_id: str) -> ConversationResult:
    """Hold one planned conversation inside its run labels (a seeded function of the run)."""
    key = f"{config.seed}:{run.scenario.scenario_id}:{run.variant_index}:{run.replay_index}"
    agent = BookingAgent.create(
        run.agent_variant,
        random.Random(f"llm:{run.agent_variant}:{key}"),
        random.Random(f"fault:{key}"),
        fault_rate=config.fault_rate,
        noise=config.noise,
        latency_scale=config.latency_scale,
        tweaks=config.tweaks,
    )
    labels = td.run_labels(
        run_id=f"{simulation_id}/{run.conversation_id}",
        simulation_id=simulation_id,
        scenario_id=run.scenario.scenario_id,
        replay_index=run.replay_index,
        variant_id=run.variant_id,
        intended_path=run.scenario.intended_path,
    )
    with td.conversation(run.conversation_id), labels:
        return agent.run(run.scenario.user_turns(run.variant_index))


def simulate(
    config: SimulationConfig,
    paths: Sequence[Sequence[str]],
    progress: Callable[[int, int], None] | None = None,
    exporter: SpanExporter | None = None,
) -> SimulationResult:
    """Run every planned conversation, export the spans over OTLP, flush, and summarize.

    ``exporter`` replaces the OTLP exporter (tests keep spans in memory with it).
    """
    simulation_id = config.simulation_id or f"sim-seed{config.seed}"
    runs = plan(config, scenarios(paths))
    td.configure(
        config.endpoint,
        service_name=config.service_name,
        service_version=config.service_version,
        protocol=config.protocol,
        set_global=False,
        exporter=exporter,
    )
    result = SimulationResult(simulation_id)
    try:
        for i, run in enumerate(runs):
            outcome = run_one(config, run, simulation_id)
            _count(result, run, outcome)
            if progress is not None:
                progress(i + 1, len(runs))
        if not td.force_flush(30_000):
            logger.warning("some spans were not exported within 30 s")
    finally:
        td.shutdown()
    return result


def _count(result: SimulationResult, run: Run, outcome: ConversationResult) -> None:
    result.runs += 1
    result.failed += int(outcome.failed)
    result.calendar_faults += int(any(e in CALENDAR_FAULTS for e in outcome.errors))
    result.results.append((run, outcome))
