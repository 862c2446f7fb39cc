"""Benchmark of ``tracedag simulate --agent example --graph``: simulated conversations/s, CCR and PCR.

Both variants of the bundled booking agent (constrained, permissive) against the designed graph
(its DFS paths, each node at most ``--max-visits`` times, are the intents), every persona of the
default file, ``--conversations`` per intent and persona, the offline scripted user, restarts up to
``--max-backtracks``; spans to the in-process collector into a fresh store (time to the last span
stored). Baseline, same run: the same intents held once each by the agent directly inside run
labels (what ``tracedag simulate`` without --agent does per conversation), no users, no
backtracking. Medians of ``--runs``.

    python bench/usersim.py --conversations 3 --runs 3
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from tracedag import instrument as td
from tracedag.pipeline.demo.agent.booking_agent import BookingAgent
from tracedag.pipeline.demo.agent.booking_graph import agent_graph
from tracedag.pipeline.demo.replay_example import example_target
from tracedag.pipeline.demo.simulate import Scenario
from tracedag.pipeline.replay.simulation import SimulationConfig, SimulationResult, rates, simulate_users
from tracedag.pipeline.replay.users import ScriptedUser, intents, load_personas
from tracedag.pipeline.service import CollectorConfig, start_collector
from tracedag.schemas.agent_graph import parse_graph


def _stored(work: object) -> tuple[float, object]:
    with tempfile.TemporaryDirectory() as tmp:
        collector = start_collector(CollectorConfig(data=Path(tmp) / "data", http_port=0, grpc_port=None))
        started = time.perf_counter()
        try:
            out = work(f"http://127.0.0.1:{collector.http_port}")  # type: ignore[operator]
            collector.flush()
        finally:
            collector.stop()
        return time.perf_counter() - started, out


def simulated(variant: str, conversations: int, backtracks: int, max_visits: int) -> tuple[float, SimulationResult]:
    """Seconds and result of one simulation of ``variant``."""
    graph = parse_graph(agent_graph("constrained"))
    target = example_target({"variant": variant})
    found, personas = intents(graph, max_visits), load_personas()

    def work(endpoint: str) -> SimulationResult:
        config = SimulationConfig(endpoint, conversations, backtracks, f"bench-{variant}", set_global=False)
        return simulate_users(target, ScriptedUser(7, target.scripted_turns), found, personas, config)

    seconds, result = _stored(work)
    assert isinstance(result, SimulationResult)
    return seconds, result


def direct(n: int, max_visits: int) -> float:
    """Seconds for ``n`` conversations held by the agent directly (cycling over the intents)."""
    paths = [i.path for i in intents(parse_graph(agent_graph("constrained")), max_visits)]

    def work(endpoint: str) -> None:
        td.configure(endpoint, service_name="court-booking-agent", set_global=False)
        for k in range(n):
            path = paths[k % len(paths)]
            agent = BookingAgent.create("constrained", random.Random(k), random.Random(-k))
            with td.conversation(f"direct-{k}"), td.run_labels(run_id=f"direct-{k}", scenario_id=str(k % len(paths))):
                agent.run(Scenario("b", path).user_turns(0))
        td.force_flush()
        td.shutdown()

    return _stored(work)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conversations", type=int, default=3)
    parser.add_argument("--max-backtracks", type=int, default=2)
    parser.add_argument("--max-visits", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    n = 0
    rows: list[tuple[str, float, str]] = []
    for variant in ("constrained", "permissive"):
        results = [simulated(variant, args.conversations, args.max_backtracks, args.max_visits) for _ in range(args.runs)]
        seconds = statistics.median(s for s, _ in results)
        result = results[0][1]
        n = len(result.conversations)
        ccr, pcr = rates(result.conversations)
        rows.append((f"simulate --agent example --agent-opt variant={variant}", n / seconds,
                     f"CCR {100 * ccr:.1f}%  PCR {100 * pcr:.1f}%  {result.runs} runs"))
    base = n / statistics.median(direct(n, args.max_visits) for _ in range(args.runs))
    print(f"simulated users, {n} conversations per variant (intents x 4 personas x {args.conversations}), "
          f"B={args.max_backtracks}, median of {args.runs}")
    print(f"  {'baseline: agent held directly, one run per conversation':<58} {base:8.1f} conversations/s   x1.00")
    for name, rate, figures in rows:
        print(f"  {name:<58} {rate:8.1f} conversations/s   x{rate / base:.2f}   {figures}")


if __name__ == "__main__":
    main()
