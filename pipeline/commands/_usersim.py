"""``tracedag simulate --agent TARGET --graph GRAPH``: simulated users against any agent, CCR and PCR.

Options of the ``simulate`` command (pipeline/commands/demo.py); this module holds the work so that
command stays a thin switch. No commands of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from rich.table import Table

    from tracedag.pipeline.replay.simulation import Conversation, SimulationResult
    from tracedag.schemas.agent_graph import AgentGraph


class BadInput(click.ClickException):
    """A graph, personas file or agent that cannot be used: one line, exit code 2."""

    exit_code = 2


@dataclass(frozen=True)
class UserSimArgs:
    """What ``tracedag simulate --agent`` was given."""

    agent: str
    graph: Path
    agent_opts: tuple[str, ...] = ()
    personas: Path | None = None
    persona_names: tuple[str, ...] = ()
    conversations: int = 1
    max_backtracks: int = 2
    max_visits: int = 1
    user_model: str | None = None
    user_base_url: str | None = None
    seed: int = 7
    data: Path | None = None
    endpoint: str = "http://127.0.0.1:4318"
    simulation_id: str | None = None


def run_user_simulation(args: UserSimArgs) -> None:
    """Load the graph, personas and target; hold every conversation; print the table; store the runs."""
    from tracedag.pipeline.commands.replay import _progress, _sink
    from tracedag.pipeline.demo.replay_example import example_target
    from tracedag.pipeline.replay import load_target, parse_opts
    from tracedag.pipeline.replay.simulation import SimulationConfig, simulate_users
    from tracedag.pipeline.replay.users import (
        ModelUser,
        ScriptedUser,
        intents,
        load_personas,
        select_personas,
    )
    from tracedag.schemas.agent_graph import load_graph
    from tracedag.schemas.errors import TracedagError

    try:
        graph = _bundled_graph() if str(args.graph) == "example" else load_graph(args.graph)
        personas = select_personas(load_personas(args.personas), args.persona_names)
        target = load_target(args.agent, parse_opts(args.agent_opts), {"example": example_target})
    except TracedagError as e:
        raise BadInput(str(e)) from e
    found = intents(graph, args.max_visits)
    if args.user_model:
        user: ModelUser | ScriptedUser = ModelUser(args.user_model, args.user_base_url, args.seed)
    else:
        user = ScriptedUser(args.seed, getattr(target, "scripted_turns", None))
    sim_id = args.simulation_id or f"usersim-seed{args.seed}"
    where = str(args.data) if args.data else args.endpoint
    with _sink(args.data, None) if args.data else nullcontext(args.endpoint) as url, _progress() as advance:
        config = SimulationConfig(url, args.conversations, args.max_backtracks, sim_id)
        result = simulate_users(target, user, found, personas, config, advance)
    _report(result, where)


def _bundled_graph() -> AgentGraph:
    """``--graph example``: the designed graph of the bundled booking agent."""
    from tracedag.pipeline.demo.agent.booking_graph import agent_graph
    from tracedag.schemas.agent_graph import parse_graph

    return parse_graph(agent_graph("constrained"))


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _report(result: SimulationResult, where: str) -> None:
    from rich.console import Console
    from rich.table import Table

    from tracedag.pipeline.replay.simulation import rates

    console = Console()
    table = Table(title=f"simulated users {result.simulation_id}")
    for col in ("intent", "path", "conversations", "runs", "restarts", "CCR", "PCR"):
        table.add_column(col)
    by_intent: dict[str, list[Conversation]] = {}
    for c in result.conversations:
        by_intent.setdefault(c.intent.intent_id, []).append(c)
    for iid, convs in by_intent.items():
        _row(table, iid, convs, end_section=iid == list(by_intent)[-1])
    _row(table, "overall", result.conversations)
    console.print(table)
    ccr, pcr = rates(result.conversations)
    rate = len(result.conversations) / result.seconds if result.seconds else 0.0
    console.print(f"CCR {_pct(ccr)}, PCR {_pct(pcr)} over {len(result.conversations)} conversations "
                  f"({result.runs} runs, {rate:.1f} conversations/s); spans sent to {where} "
                  f"(simulation_id={result.simulation_id})", highlight=False, soft_wrap=True)
    if result.conversations and not any(a.nodes for c in result.conversations for a in c.attempts):
        console.print("warning: no node span was seen in any run (gen_ai.node.name, tracedag.node.name, graph.node.name "
                      "or langgraph_node, started in this process), so no transition could be compared: an agent "
                      "behind a URL is not seen from here; trace its nodes with td.node(name) in a module:function "
                      "agent", highlight=False, soft_wrap=True)
    if "://" not in where:
        console.print(f"next: tracedag build --data {where} && tracedag determinism --data {where}",
                      highlight=False, soft_wrap=True)


def _row(table: Table, label: str, cs: Sequence[Conversation], end_section: bool = False) -> None:
    from tracedag.pipeline.replay.simulation import rates

    ccr, pcr = rates(cs)
    path = " > ".join(cs[0].intent.path) if label != "overall" and cs else ""
    table.add_row(label, path, str(len(cs)), str(sum(len(c.attempts) for c in cs)),
                  str(sum(c.restarts for c in cs)), _pct(ccr), _pct(pcr), end_section=end_section)

