"""The demo's simulated users: both variants of the bundled agent on its designed graph (CCR, PCR).

``tracedag demo`` stores these runs in a store of their own under the demo's data directory
(``usersim/``), so the demo's own figures stay those of the simulation.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path

from tracedag.pipeline.demo.agent import booking_graph as graph
from tracedag.pipeline.demo.replay_example import example_target

DEMO_USERSIM_DIR = "usersim"


def demo_usersim(data: Path, max_backtracks: int = 2) -> dict[str, int]:
    """One scripted user (persona terse) per intent of the designed graph against each variant, into
    ``<data>/usersim/``; CCR and PCR in tenths of a percent per variant, and the conversations held."""
    from tracedag.pipeline.replay.simulation import SimulationConfig, rates, simulate_users
    from tracedag.pipeline.replay.users import ScriptedUser, intents, load_personas, select_personas
    from tracedag.pipeline.service import CollectorConfig, start_collector
    from tracedag.schemas.agent_graph import parse_graph

    found = intents(parse_graph(graph.agent_graph("constrained")), max_visits=2)
    personas = select_personas(load_personas(), ["terse"])
    counts: dict[str, int] = {"usersim_conversations": 0, "usersim_backtracks": max_backtracks}
    collector = start_collector(CollectorConfig(data=data / DEMO_USERSIM_DIR, http_port=0, grpc_port=None))
    try:
        for variant in graph.VARIANTS:
            target = example_target({"variant": variant})
            config = SimulationConfig(f"http://127.0.0.1:{collector.http_port}", 1, max_backtracks,
                                      f"demo-usersim-{variant}", set_global=False)
            result = simulate_users(target, ScriptedUser(7, target.scripted_turns), found, personas, config)
            ccr, pcr = rates(result.conversations)
            counts[f"usersim_ccr_{variant}"] = round(1000 * ccr)
            counts[f"usersim_pcr_{variant}"] = round(1000 * pcr)
            counts["usersim_conversations"] += len(result.conversations)
        collector.flush()
    finally:
        collector.stop()
    return counts


def usersim_line(data: Path, counts: Mapping[str, int]) -> str:
    """One line: CCR and PCR of the two variants, and the command to try next."""
    where = shlex.quote(str(data / DEMO_USERSIM_DIR))
    figures = ", ".join(f"{v} CCR {counts[f'usersim_ccr_{v}'] / 10:.1f}% PCR {counts[f'usersim_pcr_{v}'] / 10:.1f}%"
                        for v in graph.VARIANTS)
    return (f"simulated users: {counts['usersim_conversations']} conversations on the designed graph's paths "
            f"(up to {counts['usersim_backtracks']} restarts each): {figures} (stored in {where}); try: "
            f"tracedag simulate --agent example --graph example --data {where} --agent-opt variant=permissive")
