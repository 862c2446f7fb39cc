"""Rich progress bars for long commands: one bar per phase, drawn only when asked for.

``bars`` yields ``advance(phase, done, total)``: ``done`` more steps of ``phase``, whose bar is made the
first time the phase is named. ``total`` sets the phase's total; ``None`` keeps the one it has (unknown
until one is given). It imports nothing of tracedag, so every stage and command may use it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import TaskID

Advance: TypeAlias = Callable[[str, int, "int | None"], None]
"""``advance(phase, done, total)``: ``done`` more steps of ``phase``; ``total`` None keeps its total."""


def no_progress(phase: str, done: int, total: int | None) -> None:
    """An ``Advance`` that draws nothing."""


@contextmanager
def bars(enabled: bool = True, *, console: Console | None = None, transient: bool = True) -> Iterator[Advance]:
    """Bars on ``console`` (rich's default, stdout, when None) while the block runs; ``transient`` ones go
    when it ends. Not ``enabled``: nothing is drawn and rich is not imported."""
    if not enabled:
        yield no_progress
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=transient) as progress:
        tasks: dict[str, TaskID] = {}

        def advance(phase: str, done: int, total: int | None) -> None:
            if phase not in tasks:
                tasks[phase] = progress.add_task(phase, total=total)
            progress.update(tasks[phase], advance=done, total=total)

        yield advance
