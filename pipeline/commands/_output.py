"""Printing what a person reads: whole tables, also when stdout is a file or a CI log."""

from __future__ import annotations

import sys
from typing import Any

MIN_WIDTH = 80


def print_whole(renderable: Any, *, err: bool = False) -> None:
    """Print ``renderable`` at the terminal's width, or, when not writing to a terminal, at its
    natural width (a piped table is never cut to 80 columns)."""
    from rich.console import Console

    stream = sys.stderr if err else sys.stdout
    if stream.isatty():
        Console(stderr=err).print(renderable)
        return
    probe = Console(width=100_000, stderr=err)
    width = max(MIN_WIDTH, probe.measure(renderable).maximum)
    Console(width=width, stderr=err).print(renderable)
