"""The bundled court-booking agent as a ``tracedag replay`` target (``--agent example``).

Options (``--agent-opt NAME=VALUE``): ``variant`` (constrained | permissive, default constrained),
``seed`` (default 7), ``fault_rate`` (share of failing calendar calls, default 0.25), ``noise``,
``latency_scale``, and every knob of ``tweaks.Tweaks`` (``drop_time_rate``, ``skip_availability_rate``,
``calendar_latency``, ``rephrase``), so a replay can produce a regression on demand. Each run's
model and tools are seeded by the seed, the source conversation and the replay index.
"""

from __future__ import annotations

import dataclasses
import random
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tracedag.pipeline.demo.agent import booking_graph as graph
from tracedag.pipeline.demo.agent.booking_agent import BookingAgent
from tracedag.pipeline.demo.agent.tweaks import Tweaks
from tracedag.pipeline.replay.targets import Outcome, ReplayTargetError, RunInfo

_NUMBERS = {"fault_rate": 0.25, "noise": 0.04, "latency_scale": 1.0}
_TWEAKS = {f.name for f in dataclasses.fields(Tweaks)}


@dataclass
class ExampleTarget:
    """The booking agent of one variant, one seeded agent per run."""

    variant: graph.Variant = "constrained"
    seed: int = 7
    fault_rate: float = 0.25
    noise: float = 0.04
    latency_scale: float = 1.0
    tweaks: Tweaks = field(default_factory=Tweaks)
    name: str = "example"
    service_name: str = "court-booking-agent"
    service_version: str | None = "1.0"

    def converse(self, turns: Sequence[str], run: RunInfo) -> Outcome:
        """One conversation of the agent, seeded by the run; a failed conversation is a failed run."""
        key = f"{self.seed}:{run.conversation_id}:{run.variant_id or ''}:{run.replay_index}"
        agent = BookingAgent.create(self.variant, random.Random(f"llm:{self.variant}:{key}"),
                                    random.Random(f"fault:{key}"), fault_rate=self.fault_rate, noise=self.noise,
                                    latency_scale=self.latency_scale, tweaks=self.tweaks)
        result = agent.run(list(turns))
        error = f"failed steps: {', '.join(result.unrecovered)} ({', '.join(result.errors)})" if result.failed else None
        return Outcome(result.replies, error)

    def scripted_turns(self, path: Sequence[str], index: int) -> list[str]:
        """The simulated user's turns that lead this agent along ``path`` (phrasing ``index``, 0..2)."""
        from tracedag.pipeline.demo.simulate import Scenario

        return [str(t) for t in Scenario("sim", tuple(path)).user_turns(index)]


def example_target(opts: Mapping[str, str]) -> ExampleTarget:
    """Build the example target from ``--agent-opt`` pairs."""
    target = ExampleTarget()
    tweak_pairs = [f"{k}={v}" for k, v in opts.items() if k in _TWEAKS]
    for name, value in opts.items():
        if name in _TWEAKS:
            continue
        if name == "variant":
            if value not in graph.VARIANTS:
                raise ReplayTargetError(f"--agent-opt variant={value!r}: one of {', '.join(graph.VARIANTS)}")
            target.variant = value
        elif name == "seed":
            target.seed = int(_number(name, value, int))
        elif name in _NUMBERS:
            setattr(target, name, _number(name, value, float))
        else:
            known = ", ".join(["variant", "seed", *_NUMBERS, *sorted(_TWEAKS)])
            raise ReplayTargetError(f"--agent-opt {name}: not an option of the example agent ({known})")
    target.tweaks = Tweaks.from_pairs(tweak_pairs)
    return target


def _number(name: str, value: str, kind: type[int] | type[float]) -> int | float:
    try:
        number = kind(value)
    except ValueError as e:
        raise ReplayTargetError(f"--agent-opt {name}={value!r}: not a number") from e
    if number < 0 or (name == "fault_rate" and number > 1):
        raise ReplayTargetError(f"--agent-opt {name}={value!r}: out of range")
    return number


DEMO_REPLAY_DIR = "replay"
"""Where ``tracedag demo`` stores its replays: a store of its own under the demo's data directory,
so the demo's own figures (counts, determinism, the gate) stay those of the simulation."""


def demo_replay(data: Path, conversations: int = 2, times: int = 2) -> dict[str, int]:
    """Replay the first failed conversations of the demo store ``times`` times with recorded tools,
    into ``<data>/replay/``; the figures of the demo line."""
    from tracedag.pipeline.replay import ReplayConfig, Selection, replay, select_conversations
    from tracedag.pipeline.replay.recording import with_tool_calls
    from tracedag.pipeline.service import CollectorConfig, start_collector

    sources = with_tool_calls(data, select_conversations(data, Selection(failed_only=True))[:conversations])
    collector = start_collector(CollectorConfig(data=data / DEMO_REPLAY_DIR, http_port=0, grpc_port=None))
    try:
        config = ReplayConfig(endpoint=f"http://127.0.0.1:{collector.http_port}", times=times, tools="recorded",
                              replay_id="demo-replay", set_global=False)
        result = replay(sources, example_target({}), config)
        collector.flush()
    finally:
        collector.stop()
    served, live, unmatched = result.tool_counts()
    return {"replay_conversations": len(sources), "replay_times": times, "replay_runs": len(result.records),
            "replay_failed": len(result.failed), "replay_served": served, "replay_tool_calls": served + live + unmatched}


def replay_line(data: Path, counts: Mapping[str, int]) -> str:
    """One line: the demo's replay and the command to try next."""
    where = shlex.quote(str(data))
    return (f"replay: {counts['replay_conversations']} failed conversations replayed {counts['replay_times']}x "
            f"against the example agent, {counts['replay_failed']} of {counts['replay_runs']} runs failed again, "
            f"{counts['replay_served']} of {counts['replay_tool_calls']} tool calls served from the recording "
            f"(stored in {where}/{DEMO_REPLAY_DIR}); try: tracedag replay --data {where} --agent example "
            "--failed --times 3 --tools recorded")
