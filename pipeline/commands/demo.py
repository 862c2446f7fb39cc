"""CLI commands: demo."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import click
from click.core import ParameterSource


@click.command("demo")
@click.option("--data", "data", type=click.Path(file_okay=False, path_type=Path), default="./tracedag-demo",
              show_default=True, help="Data directory of the demo (wiped at start unless --keep).")
@click.option("--seed", default=7, show_default=True, type=int, help="Seed of the simulated agent and its faults.")
@click.option("--keep", is_flag=True, help="Keep what is already in the data directory.")
def demo_command(data: Path, seed: int, keep: bool) -> None:
    """Run the whole product end to end: collector, simulated agent, DAGs, scores, root causes, determinism.

    Starts the collector on free loopback ports, drives the bundled court-booking agent (two
    variants, one flaky tool) through every conversation path of its graph over OTLP, then builds,
    scores and analyzes the store and prints what it found. No network, nothing to configure.
    """
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from tracedag.pipeline.commands._table import whole_console
    from tracedag.pipeline.demo.config import DemoConfig
    from tracedag.pipeline.demo.report import print_demo
    from tracedag.pipeline.demo.run import run_demo

    console = Console()
    console.print(f"[bold]tracedag demo[/bold]  seed {seed}, data {escape(str(data))}")
    columns = (TextColumn("{task.description:<40}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        result = run_demo(DemoConfig(data=data, seed=seed, keep=keep), progress)
    print_demo(whole_console(), result)  # whole tables in a pipe or CI log
    unavailable = [s for s, status in result.stages.items() if status != "ok"]
    if unavailable:
        raise click.ClickException(f"stages not completed: {', '.join(unavailable)}")


@click.command("simulate")
@click.option("--endpoint", default="http://127.0.0.1:4318", show_default=True,
              help="OTLP endpoint: http://host:port for HTTP, host:port for gRPC.")
@click.option("--protocol", type=click.Choice(["http/protobuf", "grpc"]), default="http/protobuf", show_default=True)
@click.option("--seed", default=7, show_default=True, type=int, help="Seed of the simulated agent and its faults.")
@click.option("--replays", default=3, show_default=True, type=click.IntRange(min=1), help="Exact replays per scenario.")
@click.option("--variants", default=2, show_default=True, type=click.IntRange(min=0, max=2),
              help="Rephrased variants per scenario (each replayed too).")
@click.option("--fault-rate", default=0.25, show_default=True, type=click.FloatRange(0, 1),
              help="Share of calendar calls that fail (timeout or HTTP 503).")
@click.option("--max-visits", default=2, show_default=True, type=click.IntRange(min=1),
              help="Most visits of one node in an enumerated conversation path (bounds loops).")
@click.option("--service-version", default="1.0", show_default=True,
              help="service.version of the spans (a run label `tracedag regress` selects by).")
@click.option("--simulation-id", default=None, help="Names the whole simulation (default sim-seed<SEED>).")
@click.option("--agent-opt", "agent_opts", multiple=True, metavar="NAME=VALUE",
              help="A default-off change to the agent (repeatable): drop_time_rate, skip_availability_rate, "
                   "calendar_latency, rephrase (see tracedag.pipeline.demo.agent.tweaks); with --agent, an option "
                   "of that agent (as in tracedag replay).")
@click.option("--agent", "agent", default=None, metavar="TARGET",
              help="Simulated users against this agent (module:function, an OpenAI-compatible URL, or 'example'); "
                   "needs --graph. Measures CCR and PCR with backtracking.")
@click.option("--graph", "graph_file", default=None, type=click.Path(dir_okay=False, path_type=Path),
              help="With --agent: the agent graph (DSL JSON) whose DFS paths are the users' intents; 'example': the "
                   "bundled agent's designed graph.")
@click.option("--personas", "personas", default=None, type=click.Path(dir_okay=False, path_type=Path),
              help="With --agent: personas YAML (name, prompt, temperature); default: terse, chatty, rude, confused.")
@click.option("--persona", "persona_names", multiple=True, metavar="NAME",
              help="With --agent: only this persona (repeatable; default every persona of the file).")
@click.option("--conversations", default=1, show_default=True, type=click.IntRange(min=1),
              help="With --agent: conversations per intent and persona.")
@click.option("--max-backtracks", default=2, show_default=True, type=click.IntRange(min=0),
              help="With --agent: restarts from the beginning after an unintended transition.")
@click.option("--user-model", default=None, envvar="TRACEDAG_USER_MODEL",
              help="With --agent: a model plays the user (OpenAI-compatible); default: the offline scripted user.")
@click.option("--user-base-url", default=None, envvar="TRACEDAG_USER_BASE_URL",
              help="OpenAI-compatible endpoint of --user-model (default: the openai client's).")
@click.option("--data", "data", default=None, type=click.Path(file_okay=False, path_type=Path),
              help="With --agent: store the runs into this data directory (in-process collector) instead of --endpoint; "
                   "with --endpoint too: the store the collector at --endpoint writes (an agent behind a URL is read "
                   "back from it).")
@click.option("--parallel", default=1, show_default=True, type=click.IntRange(min=1, max=64),
              help="With --agent: conversations held at the same time (the restarts of one stay in order).")
@click.option("--settle", default=15.0, show_default=True, type=click.FloatRange(min=0),
              help="With an agent behind a URL: seconds to wait, a turn, for its spans to reach the --data store.")
@click.option("--nodes", "nodes", type=click.Choice(["auto", "process", "store"]), default="auto", show_default=True,
              help="With --agent: where the agent's node spans are read: this process's spans, or the --data store "
                   "by trace id (auto: the store for an agent behind a URL).")
@click.option("--fail-on-failure", "fail_on_failure", is_flag=True,
              help="Exit 1 when a conversation's agent failed too (default: a failing agent is a result, counted; "
                   "exit 1 only when a run could not run or the collector did not take the spans).")
def simulate_command(endpoint: str, protocol: Literal["http/protobuf", "grpc"], seed: int, replays: int, variants: int,
                     fault_rate: float, max_visits: int, service_version: str = "1.0", simulation_id: str | None = None,
                     agent_opts: tuple[str, ...] = (), agent: str | None = None, graph_file: Path | None = None,
                     personas: Path | None = None, persona_names: tuple[str, ...] = (), conversations: int = 1,
                     max_backtracks: int = 2, user_model: str | None = None, user_base_url: str | None = None,
                     data: Path | None = None, parallel: int = 1, settle: float = 15.0, nodes: str = "auto",
                     fail_on_failure: bool = False) -> None:
    """Drive the bundled court-booking agent through its conversation paths and export the spans over OTLP.

    Both variants (constrained and permissive transitions) run every DFS path of the designed
    graph as exact replays and rephrased variants, with run labels; point it at `tracedag collect`.
    With --agent and --graph: simulated users (EDGE §3.1) play the graph's paths against any agent,
    restarting after an unintended transition, and CCR/PCR are printed per intent. An agent behind a
    URL is read back from the --data store. Exit code 0 when every conversation ran to its end (an
    agent that failed is a result, counted); 1 when a run could not run, when the collector does not
    take the spans (nothing was stored), or with --fail-on-failure when an agent failed; 130 when
    interrupted.
    """
    if agent is not None or graph_file is not None:
        from tracedag.pipeline.commands._usersim import UserSimArgs, run_user_simulation

        if agent is None or graph_file is None:
            raise click.UsageError("--agent and --graph go together")
        given = click.get_current_context().get_parameter_source("endpoint") is not ParameterSource.DEFAULT
        run_user_simulation(UserSimArgs(agent, graph_file, agent_opts, personas, persona_names, conversations,
                                        max_backtracks, max_visits, user_model, user_base_url, seed, data, endpoint,
                                        simulation_id, parallel, settle, nodes, endpoint_given=given,
                                        fail_on_failure=fail_on_failure))
        return
    _simulate_bundled(endpoint, protocol, seed, replays, variants, fault_rate, max_visits, service_version,
                      simulation_id, agent_opts, fail_on_failure)


def _simulate_bundled(endpoint: str, protocol: Literal["http/protobuf", "grpc"], seed: int, replays: int,
                      variants: int, fault_rate: float, max_visits: int, service_version: str,
                      simulation_id: str | None, agent_opts: tuple[str, ...], fail_on_failure: bool) -> None:
    """The bundled agent's paths over OTLP; exit 1 when the collector did not take the spans (or, asked for,
    when a conversation failed)."""
    from rich.progress import Progress

    from tracedag.pipeline.demo import simulate as sim
    from tracedag.pipeline.demo.agent.tweaks import Tweaks
    from tracedag.pipeline.demo.stages import conversation_paths
    from tracedag.pipeline.replay.export import CountingExporter, otlp_exporter, probe, unreachable_message

    if not probe(endpoint, protocol):
        raise click.ClickException(unreachable_message(endpoint))
    counting = CountingExporter(otlp_exporter(endpoint, protocol))
    config = sim.SimulationConfig(endpoint=endpoint, protocol=protocol,
                                  seed=seed, replays=replays, variants=variants, fault_rate=fault_rate,
                                  service_version=service_version, simulation_id=simulation_id,
                                  tweaks=Tweaks.from_pairs(agent_opts))
    with Progress() as progress:
        task = progress.add_task("simulate conversations")
        result = sim.simulate(config, conversation_paths(max_visits),
                              lambda done, total: progress.update(task, completed=done, total=total), counting)
    click.echo(f"{result.runs} conversations sent to {endpoint} ({result.failed} failed, "
               f"{result.calendar_faults} with a calendar fault), simulation id {result.simulation_id}")
    delivery = counting.delivery()
    if delivery.lost:
        from tracedag.pipeline.commands.replay import lost_line

        raise click.ClickException(lost_line(delivery, endpoint))
    if fail_on_failure and result.failed:
        raise click.ClickException(f"{result.failed} of {result.runs} conversations failed (--fail-on-failure)")


COMMANDS: list[click.Command] = [demo_command, simulate_command]
