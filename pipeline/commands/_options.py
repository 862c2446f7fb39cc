"""Options shared by the commands."""

from __future__ import annotations

from pathlib import Path

import click

data_option = click.option(
    "--data",
    "data",
    envvar="TRACEDAG_DATA",
    default="./tracedag-data",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Data directory (env TRACEDAG_DATA).",
)
