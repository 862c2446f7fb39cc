"""Options shared by the commands."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from tracedag.schemas.layout import is_store

_F = TypeVar("_F", bound=Callable[..., Any])


def _existing_store(ctx: click.Context, param: click.Parameter, value: Path) -> Path:
    """Refuse a ``--data`` that holds no store: a typo must not read as an empty answer."""
    if not is_store(value):
        where = "does not exist" if not value.exists() else "holds no tracedag store (no spool/, tables/ or state/)"
        raise click.BadParameter(
            f"{value} {where}. Collect or ingest spans into it first (tracedag collect --data {value}, "
            f"tracedag ingest FILE --data {value}), or point --data / TRACEDAG_DATA at an existing store.",
            ctx=ctx, param=param,
        )
    return value


def _store_option(create: bool) -> Callable[[_F], _F]:
    help_text = "Data directory (env TRACEDAG_DATA)" + ("; created when missing." if create else "; must exist.")
    option: Callable[[_F], _F] = click.option(
        "--data", "data", envvar="TRACEDAG_DATA", default="./tracedag-data", show_default=True,
        type=click.Path(file_okay=False, path_type=Path), help=help_text,
        callback=None if create else _existing_store,
    )
    return option


data_option = _store_option(create=False)
"""``--data`` of every command that reads a store: an error when there is none at the path."""

new_data_option = _store_option(create=True)
"""``--data`` of the commands that fill a store (``collect``, ``ingest``): created when missing."""
