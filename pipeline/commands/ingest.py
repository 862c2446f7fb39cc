"""CLI commands: ingest (load OTLP dump files into the spans table)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

import click

from tracedag.pipeline.commands._options import new_data_option
from tracedag.pipeline.commands._table import print_whole

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from tracedag.pipeline.ingest.dumps import FileResult


@click.command("ingest")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@new_data_option  # type: ignore[untyped-decorator, unused-ignore]
def ingest(files: tuple[Path, ...], data: Path) -> None:
    """Load OTLP dumps: JSON lines, one JSON document, or length-prefixed protobuf (format detected).

    Spans are validated like the collector does and take its road: spool segments, converted at once
    (de-duplicated on (trace_id, span_id) against what is already stored). A bad line is reported and
    skipped. Their traces are complete: `tracedag build` builds them without the idle wait.
    """
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    from tracedag.pipeline.ingest.dumps import ingest_dump

    console = Console(stderr=True)
    results = []
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        for path in files:
            task = progress.add_task(path.name, total=_size(path))
            results.append(ingest_dump(data, path, functools.partial(_advance, progress, task)))
    _summary(results)
    if any(r.summary.bad_items for r in results):
        for r in results:
            for err in r.summary.errors[:20]:
                console.print(f"[yellow]{escape(str(r.path))}[/] {escape(str(err))}")


def _advance(progress: Progress, task: TaskID, done: int) -> None:
    progress.update(task, completed=done)


def _size(path: Path) -> int | None:
    """Uncompressed size for the progress bar (the file size unless it is gzip)."""
    with open(path, "rb") as fh:
        gz = fh.read(2) == b"\x1f\x8b"
    return None if gz else path.stat().st_size


def _summary(results: list[FileResult]) -> None:
    from rich.table import Table

    table = Table(title="tracedag ingest")
    for col in ("file", "format", "spans read", "stored", "duplicates", "conflicts", "rejected", "bad items"):
        table.add_column(col, justify="left" if col in ("file", "format") else "right")
    for r in results:
        s, st = r.summary, r.stats
        table.add_row(r.path.name, s.format, str(s.spans_read), str(st.spans_stored), str(st.duplicates),
                      str(st.conflicts), str(s.rejected), str(s.bad_items))
    print_whole(table)
    reasons: dict[str, int] = {}
    for r in results:
        for reason, n in r.summary.reasons.items():
            reasons[reason] = reasons.get(reason, 0) + n
    for reason, n in sorted(reasons.items()):
        click.echo(f"rejected {n}: {reason}")


COMMANDS: list[click.Command] = [ingest]
