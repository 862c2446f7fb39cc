"""CLI commands: build, show."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from tracedag.pipeline.commands._engine import engine_for, engine_options
from tracedag.pipeline.commands._options import data_option as _shared_data_option
from tracedag.pipeline.commands._table import print_whole

_F = TypeVar("_F", bound=Callable[..., Any])
data_option: Callable[[_F], _F] = _shared_data_option


@click.command("build")
@data_option
@click.option("--idle", "idle", default=30.0, show_default=True, type=float,
              help="A live trace is complete once no span arrived for it for this many seconds "
                   "(traces loaded by tracedag ingest are complete at once).")
@click.option("--full", is_flag=True, help="Rebuild every complete trace, not only new or changed ones.")
@click.option("--spec", "spec", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Workflow spec (YAML/JSON): steps and allowed dependencies; deviant traces are flagged.")
@click.option("--tolerance-ms", "tolerance_ms", default=1.0, show_default=True, type=float,
              help="Clock-skew tolerance: B follows A when B started no earlier than this before A ended.")
@click.option("--compact", is_flag=True,
              help="Merge the small files of traces, dag_nodes, dag_edges and step_scores now (also after a skipped build).")
@click.option("--max-small-files", "max_small_files", default=16, show_default=True, type=int,
              help="After a build, merge a derived table's small files once it has more than this many.")
@engine_options
def build_command(data: Path, idle: float, full: bool, spec: Path | None, tolerance_ms: float, compact: bool,
                  max_small_files: int, engine: str = "local", ray_address: str | None = None,
                  workers: int | None = None) -> None:
    """Turn complete traces into the traces, dag_nodes and dag_edges tables (incremental).

    Args:
        data: the data directory.
        idle: seconds without a new span after which a trace counts as complete.
        full: rebuild all complete traces.
        spec: optional workflow spec file.
        tolerance_ms: skew tolerance of the happened-before order among siblings.
        compact: merge small derived files now.
        max_small_files: small files per table that trigger a merge after a build.
        engine: local, or ray (one task per trace-id bucket on the cluster at ray_address, else a
            local cluster of ``workers`` CPUs).
    """
    from rich.table import Table

    from tracedag.pipeline.dag import build_store
    from tracedag.pipeline.dag.spec import load_spec
    from tracedag.pipeline.store.files import parquet_files
    from tracedag.pipeline.store.gc import GcSettings

    if spec is not None:
        load_spec(spec)  # a bad spec is an error whatever the store holds
    if not parquet_files(data, "spans"):
        click.echo(f"no spans in {data} yet: nothing to build. Send spans to `tracedag collect --data {data}` "
                   f"or load a dump with `tracedag ingest FILE --data {data}`, then build.", err=True)
        return
    with engine_for(engine, ray_address, workers) as running:
        stats = build_store(data, idle_seconds=idle, full=full, spec=spec, progress=True,
                            tolerance_ns=int(tolerance_ms * 1e6), compact=compact,
                            gc=GcSettings(max_small_files=max_small_files), engine=running)
    if stats.skipped:
        click.echo("nothing changed since the last build (no new spans, no trace became complete)")
        _echo_gc(stats)
        return
    table = Table(title="tracedag build", show_header=False)
    rows = [("build id", stats.build_id), ("traces built", stats.traces_built), ("spans", stats.spans), ("edges", stats.edges),
            *[(f"  method {m}", c) for m, c in sorted(stats.methods.items())],
            ("orphans", stats.orphans), ("clock skew", stats.clock_skew), ("deviant traces", stats.deviant),
            ("unchanged traces", stats.traces_unchanged), ("still receiving", stats.traces_pending),
            ("engine", stats.engine if running is None else f"{stats.engine} ({stats.tasks} tasks)"),
            ("seconds", f"{stats.seconds:.2f}")]
    for label, value in rows:
        table.add_row(label, str(value))
    print_whole(table)
    _echo_gc(stats)
    if stats.traces_pending:
        click.echo(f"{stats.traces_pending} traces got spans in the last {idle:g}s; use --idle 0 to build them now.")


def _echo_gc(stats: Any) -> None:
    """One line per derived table that the collection after the build changed."""
    gc = stats.gc
    if gc is None:
        return
    for t in sorted({*gc.deleted, *gc.rewritten, *gc.merged}):
        orphans = gc.orphan_rows.get(t, 0)
        click.echo(f"gc {t}: {gc.deleted.get(t, 0)} superseded files deleted, {gc.rewritten.get(t, 0)} rewritten, "
                   f"{gc.merged.get(t, 0)} small files merged, {gc.rows_dropped.get(t, 0) - orphans} superseded rows dropped"
                   + (f", orphaned rounds: {orphans} rows dropped" if orphans else ""))
    for t in gc.skipped:
        click.echo(f"gc {t}: skipped (a scorer is running)")


@click.command("show")
@click.argument("trace_id")
@data_option
def show_command(trace_id: str, data: Path) -> None:
    """Print the DAG of one trace (id or unique prefix) as an indented timeline, its root cause and
    the failing steps the failure propagated through marked.

    Args:
        trace_id: the trace id, or a prefix of it that matches one built trace.
        data: the data directory.
    """
    from rich.console import Group

    from tracedag.pipeline.dag.show import load_shown, render_trace
    from tracedag.pipeline.dag.show_check import check_line

    shown = load_shown(data, trace_id)
    view = render_trace(shown.trace, shown.nodes, shown.cause)
    print_whole(view if shown.check is None else Group(view, check_line(shown.check)))  # under the root cause


COMMANDS: list[click.Command] = [build_command, show_command]
