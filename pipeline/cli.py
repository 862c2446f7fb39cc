"""The ``tracedag`` command line: one click group, thin commands in ``pipeline/commands/``."""

from __future__ import annotations

import logging

import click

from tracedag.pipeline.commands import (
    _docs,
    analysis,
    build,
    capture,
    collect,
    confirm,
    demo,
    ingest,
    query,
    regress,
    replay,
    score,
    serve,
    validate,
)
from tracedag.schemas.errors import TracedagError


class _Group(click.Group):
    """Turns domain errors into clean one-line messages at the edge."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except TracedagError as e:
            raise click.ClickException(str(e)) from e


@click.group(cls=_Group)
@click.version_option(package_name="tracedag", prog_name="tracedag")  # read at --version: importlib.metadata costs ~50 ms CPU
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
def cli(verbose: int) -> None:
    """tracedag: agent spans -> execution DAGs, step scores, root causes, determinism, in SQL."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


for _module in (collect, ingest, build, score, query, analysis, demo, regress, validate, capture, replay, confirm, serve):
    for _command in _module.COMMANDS:
        cli.add_command(_command)
_docs.link_pages(cli)  # each help ends with its page: Docs: docs/pages/<page>.md
