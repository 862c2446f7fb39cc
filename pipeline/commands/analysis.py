"""CLI commands: analysis (``determinism``, ``paths``, ``graph import|validate``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from tracedag.pipeline.commands._options import data_option

_F = TypeVar("_F", bound=Callable[..., Any])


def _with_data(f: _F) -> _F:
    """The shared ``--data`` option, typed for mypy --strict."""
    return data_option(f)

_GRAPH_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)


@click.command("determinism")
@_with_data
@click.option("--group-by", "group_by", default=None,
              help="SQL expression over the root span that groups runs into scenarios "
                   "(production data without run labels), e.g. \"attributes['app.intent']\".")
@click.option("--graph", "graph_files", type=_GRAPH_FILE, multiple=True,
              help="Agent graph (DSL JSON) for structural adherence and the picture; repeatable. Each agent "
                   "uses the graph whose name is the agent's name, else the only graph given.")
@click.option("--output", "output", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Write Parquet tables and pictures here (default: <data>/tables/<name>/, <data>/pictures/).")
@click.option("--judge-model", envvar="TRACEDAG_JUDGE_MODEL", default=None,
              help="Judge model for response consistency (env TRACEDAG_JUDGE_MODEL); offline measure without it.")
@click.option("--judge-base-url", envvar="TRACEDAG_JUDGE_BASE_URL", default=None,
              help="OpenAI-compatible endpoint of the judge (env TRACEDAG_JUDGE_BASE_URL).")
def determinism_command(
    data: Path, group_by: str | None, graph_files: tuple[Path, ...], output: Path | None,
    judge_model: str | None, judge_base_url: str | None,
) -> None:
    """Determinism over replays and variants, node/edge utility, and the agent-graph picture."""
    from rich.console import Console

    from tracedag.pipeline.analysis.determinism import analyze, write_outputs
    from tracedag.pipeline.analysis.report import group_by_hint, print_report
    from tracedag.pipeline.analysis.response import make_scorer
    from tracedag.pipeline.commands._table import whole_console
    from tracedag.pipeline.progress import bars
    from tracedag.schemas.agent_graph import load_graph

    graphs = [load_graph(f) for f in graph_files]
    scorer = make_scorer(judge_model, judge_base_url)
    err = Console(stderr=True)
    with bars(console=err) as progress:
        result = analyze(data, group_by=group_by, graphs=graphs, scorer=scorer, progress=progress)
        written = write_outputs(result, data, output, progress)
    print_report(whole_console(), result, written)
    hint = group_by_hint(result, group_by)
    if hint:
        err.print(hint, style="yellow", highlight=False, markup=False, soft_wrap=True)


@click.command("paths")
@click.argument("graph_file", type=_GRAPH_FILE)
@click.option("--max-visits", default=1, show_default=True, type=click.IntRange(min=1),
              help="Most times one node may appear in a path (bounds loops).")
@click.option("--output", "output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="JSON lines file for the paths (default: GRAPH_FILE with .paths.jsonl).")
@click.option("--limit", default=1_000_000, show_default=True, type=click.IntRange(min=1),
              help="Fail when there are more paths than this.")
def paths_command(graph_file: Path, max_visits: int, output: Path | None, limit: int) -> None:
    """Enumerate the start -> terminal paths of an agent graph by depth-first search."""
    from tracedag.pipeline.analysis.paths import write_paths
    from tracedag.schemas.agent_graph import load_graph

    graph = load_graph(graph_file)
    out = output or graph_file.with_suffix(".paths.jsonl")
    n = write_paths(graph, out, max_visits=max_visits, limit=limit)
    click.echo(f"{n} paths (max {max_visits} visit(s) per node) written to {out}")


@click.group("graph")
def graph_group() -> None:
    """Agent graphs in the tracedag DSL: import and validate."""


@graph_group.command("validate")
@click.argument("graph_file", type=_GRAPH_FILE)
def graph_validate(graph_file: Path) -> None:
    """Check an agent graph file; name the bad node or edge when it is invalid."""
    from tracedag.schemas.agent_graph import load_graph

    g = load_graph(graph_file)
    click.echo(f"ok: {len(g.nodes)} nodes, {len(g.edges)} edges, start {', '.join(g.start)}, "
               f"terminals {', '.join(g.terminals)}")


@graph_group.command("import")
@click.argument("source", type=click.Choice(["langgraph", "spans"]))
@click.argument("input_file", required=False, type=_GRAPH_FILE)
@_with_data
@click.option("--name", default=None, help="Graph name to record.")
@click.option("--output", "output", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="DSL JSON file to write.")
def graph_import(source: str, input_file: Path | None, data: Path, name: str | None, output: Path) -> None:
    """Import a graph: 'langgraph FILE' (graph.get_graph().to_json() as JSON) or 'spans' (OpenLLMetry
    gen_ai.workflow.nodes/edges attributes found in --data)."""
    from tracedag.pipeline.analysis.workflow_spans import graph_from_store
    from tracedag.schemas.agent_graph import from_langgraph, save_graph

    if source == "langgraph":
        if input_file is None:
            raise click.UsageError("langgraph needs INPUT_FILE (the JSON of graph.get_graph().to_json())")
        g = from_langgraph(json.loads(input_file.read_text(encoding="utf-8")), name=name)
    else:
        g = graph_from_store(data, name=name)
    save_graph(g, output)
    click.echo(f"wrote {output}: {len(g.nodes)} nodes, {len(g.edges)} edges")


COMMANDS: list[click.Command] = [determinism_command, paths_command, graph_group]
