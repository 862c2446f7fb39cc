"""CLI commands: demo."""

from __future__ import annotations

from pathlib import Path

import click


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
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from tracedag.pipeline.demo import DemoConfig, run_demo
    from tracedag.pipeline.demo_report import print_demo

    console = Console()
    console.print(f"[bold]tracedag demo[/bold]  seed {seed}, data {data}")
    columns = (TextColumn("{task.description:<40}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        result = run_demo(DemoConfig(data=data, seed=seed, keep=keep), progress)
    print_demo(console, result)
    unavailable = [s for s, status in result.stages.items() if status != "ok"]
    if unavailable:
        raise click.ClickException(f"stages not completed: {', '.join(unavailable)}")


COMMANDS: list[click.Command] = [demo_command]
