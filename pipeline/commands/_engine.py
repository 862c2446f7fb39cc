"""``--engine``, ``--ray-address`` and ``--workers``: where build, score and replay run their tasks."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:  # Ray is imported only when --engine ray starts one
    from tracedag.pipeline.engine import Engine

_F = TypeVar("_F", bound=Callable[..., Any])


def engine_options(fn: _F) -> _F:
    """Add the engine options to a command (parameters ``engine``, ``ray_address``, ``workers``)."""
    fn = click.option("--workers", "workers", type=click.IntRange(min=1),
                      help="CPUs of the local Ray cluster started for --engine ray (default: all).")(fn)
    fn = click.option("--ray-address", "ray_address", envvar="RAY_ADDRESS",
                      help="Ray cluster to run on (env RAY_ADDRESS; default: start a local one).")(fn)
    fn = click.option("--engine", "engine", type=click.Choice(["local", "ray"]), default="local", show_default=True,
                      help="Run in this process, or as one Ray task per trace-id bucket (pip install 'tracedag[ray]').")(fn)
    return fn


@contextmanager
def engine_for(engine: str, ray_address: str | None, workers: int | None) -> Iterator[Engine | None]:
    """The engine the options name (None: local), closed (a local cluster stopped) after the block."""
    if engine != "ray":
        yield None
        return
    from tracedag.pipeline.engine import Engine

    running = Engine(address=ray_address, workers=workers)
    try:
        yield running
    finally:
        running.close()
