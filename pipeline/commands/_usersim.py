"""``tracedag simulate --agent TARGET --graph GRAPH``: simulated users against any agent, CCR and PCR.

Options of the ``simulate`` command (pipeline/commands/demo.py); this module holds the work so that
command stays a thin switch. No commands of its own. Exit codes as ``tracedag replay``: 0 when every
run ran to its end (an agent that failed is a result, counted in CCR/PCR and listed); 1 when a run
could not run (the agent raised or was unreachable), when the collector did not take the spans, or
with ``--fail-on-failure`` when an agent failed; 130 when interrupted (the finished conversations
are kept); bad input: one line, 2.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from rich.console import Console
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
    parallel: int = 1
    settle: float = 15.0
    nodes: str = "auto"  # auto | process | store: where the agent's node spans are read
    endpoint_given: bool = False  # --endpoint given with --data: send there, read the store in --data
    fail_on_failure: bool = False  # exit 1 when an agent failed, too


def nodes_store(args: UserSimArgs) -> Path | None:
    """The store the agent's node spans are read from (None: from this process's spans).

    auto: the --data store for an agent behind a URL (its spans reach the store through its own
    exporter and collector), else this process."""
    if args.nodes == "process" or args.data is None:
        if args.nodes == "store":
            raise BadInput("--nodes store needs --data DIR: the store the agent's spans land in")
        return None
    if args.nodes == "store" or args.agent.startswith(("http://", "https://")):
        return args.data
    return None


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
    store = nodes_store(args)
    local = args.data if args.data and not args.endpoint_given else None  # store through an in-process collector
    where = str(local) if local else args.endpoint
    if local is None:
        _check_reachable(args.endpoint)
    sink = _sink(local, None) if local else nullcontext(args.endpoint)
    with sink as url, _progress() as advance:
        config = SimulationConfig(url, args.conversations, args.max_backtracks, sim_id, parallel=args.parallel,
                                  nodes_from=store, settle=args.settle)
        result = simulate_users(target, user, found, personas, config, advance)
    _report(result, where, args)
    raise SystemExit(exit_code(result, args.fail_on_failure))


def exit_code(result: SimulationResult, fail_on_failure: bool) -> int:
    """130 interrupted; 1 when spans were lost, a run could not run, or (asked for) an agent failed; else 0."""
    if result.interrupted:
        return 130
    if result.spans_lost or result.stopped or (fail_on_failure and result.failed):
        return 1
    return 0


def _check_reachable(endpoint: str) -> None:
    """Refuse to start when the collector at ``endpoint`` does not take an (empty) export."""
    from tracedag.pipeline.replay.export import probe, unreachable_message

    if not probe(endpoint):
        raise click.ClickException(unreachable_message(endpoint))


def _bundled_graph() -> AgentGraph:
    """``--graph example``: the designed graph of the bundled booking agent."""
    from tracedag.pipeline.demo.agent.booking_graph import agent_graph
    from tracedag.schemas.agent_graph import parse_graph

    return parse_graph(agent_graph("constrained"))


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _report(result: SimulationResult, where: str, args: UserSimArgs) -> None:
    from rich.table import Table

    from tracedag.pipeline.commands._table import whole_console
    from tracedag.pipeline.commands.replay import lost_line, next_line
    from tracedag.pipeline.replay.simulation import rates

    console = whole_console()
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
                  f"(simulation_id={result.simulation_id})", highlight=False, markup=False, soft_wrap=True)
    _report_failed(console, result)
    _report_waits(console, result, args)
    if result.conversations and not any(a.nodes for c in result.conversations for a in c.attempts):
        console.print(f"warning: no node span was seen in any run ({_NODE_KEYS}), so no transition could be "
                      f"compared; {_where_nodes(result, args)}", highlight=False, markup=False, soft_wrap=True)
    if result.interrupted:
        console.print(f"interrupted: {len(result.conversations)} of {result.planned} conversations finished "
                      "(their runs are kept)", highlight=False, soft_wrap=True)
    if result.spans_lost:
        console.print(lost_line(result.delivery, where), highlight=False, markup=False, soft_wrap=True)
    elif "://" not in where:
        console.print(next_line(where), highlight=False, markup=False, soft_wrap=True)


def _row(table: Table, label: str, cs: Sequence[Conversation], end_section: bool = False) -> None:
    from tracedag.pipeline.replay.simulation import rates

    ccr, pcr = rates(cs)
    path = " > ".join(cs[0].intent.path) if label != "overall" and cs else ""
    table.add_row(label, path, str(len(cs)), str(sum(len(c.attempts) for c in cs)),
                  str(sum(c.restarts for c in cs)), _pct(ccr), _pct(pcr), end_section=end_section)


_NODE_KEYS = "gen_ai.node.name, tracedag.node.name, graph.node.name or langgraph_node"
_MAX_ERRORS = 20


def _where_nodes(result: SimulationResult, args: UserSimArgs) -> str:
    if result.waits is not None:
        return (f"the agent's spans were looked for in {args.data} by trace id: the agent must extract the W3C "
                "traceparent header of each request and export its spans to the collector that writes there")
    if args.agent.startswith(("http://", "https://")):
        return ("an agent behind a URL is seen through the store its spans land in: give --data DIR (and, when a "
                "collector writes DIR, --endpoint of that collector)")
    return "trace the agent's nodes with td.node(name) (or any of those attributes)"


def _report_failed(console: Console, result: SimulationResult) -> None:
    failed = result.failed
    for conv, attempt in failed[:_MAX_ERRORS]:
        what = "could not run" if attempt.stopped else "failed"
        console.print(f"{what} {attempt.run_id} (intent {conv.intent.intent_id}, persona {conv.persona.name}): "
                      f"{attempt.error}", highlight=False, markup=False, soft_wrap=True)
    if len(failed) > _MAX_ERRORS:
        console.print(f"... and {len(failed) - _MAX_ERRORS} more failed runs", highlight=False)
    if failed:
        stopped = len(result.stopped)
        console.print(f"{len(failed) - stopped} of {result.runs} runs failed, {stopped} could not run",
                      highlight=False)


def _report_waits(console: Console, result: SimulationResult, args: UserSimArgs) -> None:
    waits = result.waits
    if waits is None:
        return
    line = (f"agent's node spans read from {args.data}: {waits.traces} traces waited for, "
            f"{waits.timed_out} not complete within --settle {args.settle:g} s")
    if waits.absent:
        line += "; none arrived, so the later traces were not waited for"
    console.print(line, highlight=False, markup=False, soft_wrap=True)
