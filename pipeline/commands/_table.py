"""Tables a person reads: fitted to a terminal's width; whole in a pipe, a file or a CI log.

On a terminal a table gets the terminal's width (rich shrinks and ellipsizes cells to fit). Anywhere
else (a pipe, ``--output FILE``, a CI log) it is printed at its natural width, the width its widest
row needs, so no cell is cut and no table is squeezed into rich's 80-column default.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

MIN_WIDTH = 80
TABLE_ROWS = 200  # rows a terminal table shows; the other formats write everything
TERMINAL_CELL = 60  # widest cell on a terminal (ellipsized beyond); in a pipe cells are whole
UNBOUNDED = 100_000  # a width no table reaches: tables (expand=False) print at their natural width


def natural_width(renderable: Any) -> int:
    """The width ``renderable`` needs to print without wrapping or cutting anything (at least 80)."""
    import io

    from rich.console import Console

    probe = Console(width=UNBOUNDED, file=io.StringIO())
    return max(MIN_WIDTH, probe.measure(renderable).maximum)


def print_whole(renderable: Any, *, err: bool = False, file: IO[str] | None = None) -> None:
    """Print ``renderable`` at the terminal's width on a terminal, else at its natural width.

    Args:
        renderable: a rich renderable (Table, Group, Text, ...).
        err: print to stderr instead of stdout.
        file: print to this file instead (never a terminal: natural width).
    """
    from rich.console import Console

    stream = file if file is not None else (sys.stderr if err else sys.stdout)
    if file is None and stream.isatty():
        Console(stderr=err).print(renderable)
        return
    Console(file=stream, width=natural_width(renderable)).print(renderable)


def whole_console(*, err: bool = False) -> Any:
    """A Console for a command that prints several tables and lines: the terminal's width on a
    terminal, else wide enough that each table prints at its natural width (nothing cut or wrapped)."""
    from rich.console import Console

    stream = sys.stderr if err else sys.stdout
    return Console(stderr=err) if stream.isatty() else Console(stderr=err, width=UNBOUNDED)


def is_terminal(output: Path | None) -> bool:
    """True when a result goes to stdout and stdout is a terminal."""
    return output is None and sys.stdout.isatty()


def cell(value: object) -> str:
    """A result value as a table cell: '' for null, 4 significant digits for a float."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def result_table(table: Any, *, terminal: bool, note: str = "") -> Any:
    """A rich Table of the first TABLE_ROWS rows of the Arrow ``table`` with a row-count caption.

    Args:
        table: a pyarrow Table.
        terminal: cells are capped at TERMINAL_CELL characters (ellipsized); else whole.
        note: appended to the caption (e.g. how to see the hidden columns).
    """
    import pyarrow as pa
    from rich.markup import escape
    from rich.table import Table

    view = Table(show_lines=False)
    for field in table.schema:
        numeric = pa.types.is_integer(field.type) or pa.types.is_floating(field.type) or pa.types.is_decimal(field.type)
        view.add_column(escape(field.name), no_wrap=True, overflow="ellipsis" if terminal else "fold",
                        max_width=TERMINAL_CELL if terminal else None, justify="right" if numeric else "left")
    for row in table.slice(0, TABLE_ROWS).to_pylist():
        view.add_row(*(escape(cell(v)) for v in row.values()))
    more = table.num_rows - TABLE_ROWS
    caption = f"{table.num_rows} rows" + (f" ({more} not shown: use --format csv)" if more > 0 else "")
    view.caption = escape(caption + note)
    return view


def print_result(table: Any, output: Path | None, *, note: str = "") -> None:
    """Print the Arrow ``table`` as a terminal table to stdout, or write it to ``output``."""
    view = result_table(table, terminal=is_terminal(output), note=note)
    if output is None:
        print_whole(view)
        return
    with open(output, "w", encoding="utf-8") as fh:
        print_whole(view, file=fh)


def shown_columns(table: Any, what: str, defaults: Sequence[str], wide: bool,
                  columns: Sequence[str] | None) -> tuple[Any, str]:
    """The columns of ``table`` to print, and a caption note saying what is hidden.

    Args:
        table: a pyarrow Table (a query result).
        what: the result's name for messages.
        defaults: the columns shown when neither ``wide`` nor ``columns`` is given (empty: all).
        wide: every column.
        columns: exactly these columns, in this order (unknown names raise a UsageError).
    """
    import click

    if wide and columns is not None:
        raise click.UsageError("give --wide or --columns, not both")
    available = table.column_names
    if columns is not None:
        return table.select(pick_columns(available, columns, what)), ""
    shown = [c for c in defaults if c in available]
    if wide or not shown or len(shown) == len(available):
        return table, ""
    hidden = len(available) - len(shown)
    return table.select(shown), f" · {hidden} more columns: --wide, or --columns a,b,c"


def pick_columns(available: Sequence[str], wanted: Sequence[str], what: str) -> list[str]:
    """The ``wanted`` columns, in that order; an unknown one raises a UsageError listing ``available``."""
    import click

    unknown = [c for c in wanted if c not in available]
    if unknown:
        raise click.UsageError(f"{what} has no column {', '.join(unknown)}; its columns: {', '.join(available)}")
    if not wanted:
        raise click.UsageError(f"--columns is empty; {what} has the columns: {', '.join(available)}")
    return list(dict.fromkeys(wanted))
