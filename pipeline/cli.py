"""The ``tracedag`` command line: one click group, thin commands in ``pipeline/commands/``."""

from __future__ import annotations

import importlib
import io
import logging
import sys
from collections.abc import Iterator, MutableMapping

import click

from tracedag.pipeline.commands import _docs
from tracedag.schemas.errors import TracedagError

HOMES: dict[str, str] = {
    "collect": "collect", "ingest": "ingest", "build": "build", "show": "build", "score": "score",
    "labels": "score", "query": "query", "queries": "query", "sql": "query", "determinism": "analysis",
    "paths": "analysis", "graph": "analysis", "demo": "demo", "simulate": "demo", "regress": "regress",
    "validate": "validate", "capture": "capture", "replay": "replay", "confirm": "confirm", "serve": "serve",
    "report": "serve",
}
"""Each command's module in ``pipeline/commands/`` (its ``COMMANDS``): a new command is added here too
(tests/test_cli_imports.py checks that this table and the modules' ``COMMANDS`` agree)."""


class _Commands(MutableMapping[str, click.Command]):
    """The group's commands, a module imported when one of its commands is looked up: a command pays for its
    own module, not the 13 (~30 ms CPU). Listing them (``--help``, iterating) imports every module."""

    def __init__(self) -> None:
        self._loaded: dict[str, click.Command] = {}

    def _load(self, module: str) -> None:
        for command in importlib.import_module(f"tracedag.pipeline.commands.{module}").COMMANDS:
            if command.name is not None and command.name not in self._loaded:
                _docs.link_command(command.name, command)  # each help ends with its page
                self._loaded[command.name] = command

    def __getitem__(self, name: str) -> click.Command:
        if name not in self._loaded and name in HOMES:
            self._load(HOMES[name])
        return self._loaded[name]

    def __setitem__(self, name: str, command: click.Command) -> None:
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        del self._loaded[name]

    def __iter__(self) -> Iterator[str]:
        for module in dict.fromkeys(HOMES.values()):
            self._load(module)
        return iter(list(self._loaded))

    def __len__(self) -> int:
        return sum(1 for _ in self)


class _Group(click.Group):
    """Turns domain errors into clean one-line messages at the edge."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except TracedagError as e:
            raise click.ClickException(str(e)) from e


def _whole_writes() -> None:
    """Give stdout and stderr a buffer when Python runs unbuffered, so no printed byte is lost.

    Under ``PYTHONUNBUFFERED=1`` (many container images set it; ``python -u``) the text streams write straight to the
    raw file, and a raw write to a pipe returns early with part of the bytes when a signal comes after some went out:
    ``tracedag query ... | less`` stopped with Ctrl-Z and resumed, a debugger or profiler attached. Python drops the
    rest. A buffer writes all of it; flushed at each line (``line_buffering``), the output is as prompt as
    unbuffered. A stream that is not the raw file (the default, a test's capture) is left alone."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if not isinstance(getattr(stream, "buffer", None), io.FileIO):
            continue
        raw = io.FileIO(stream.fileno(), "w", closefd=False)  # its own: the interpreter's stays open for it
        setattr(sys, name, io.TextIOWrapper(io.BufferedWriter(raw), encoding=stream.encoding, errors=stream.errors,
                                            line_buffering=True))


@click.group(cls=_Group)
@click.version_option(package_name="tracedag", prog_name="tracedag")  # read at --version: importlib.metadata costs ~50 ms CPU
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
def cli(verbose: int) -> None:
    """tracedag: agent spans -> execution DAGs, step scores, root causes, determinism, in SQL."""
    _whole_writes()
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


cli.commands = _Commands()
cli.epilog = _docs.docs_line(_docs.INDEX)  # each help ends with its page: Docs: docs/pages/<page>.md
