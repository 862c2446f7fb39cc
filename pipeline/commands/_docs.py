"""Where each command is documented: a page of the docs site, named at the end of its ``--help``.

The pages are ``docs/pages/*.md`` in a clone of the repository (built into a site by
``mkdocs build -f docs/mkdocs.yml``); ``tests/test_docs.py`` checks that every command has a page
here and that the page exists.
"""

from __future__ import annotations

import click

DOCS_DIR = "docs/pages"
INDEX = "index.md"

PAGES: dict[str, str] = {
    "collect": "collector.md",
    "ingest": "collector.md",
    "build": "dags.md",
    "show": "dags.md",
    "score": "scoring.md",
    "labels": "scoring.md",
    "queries": "sql.md",
    "query": "sql.md",
    "sql": "sql.md",
    "determinism": "determinism.md",
    "paths": "determinism.md",
    "graph": "determinism.md",
    "demo": "index.md",
    "regress": "regress.md",
    "validate": "validate.md",
    "capture": "testing.md",
    "replay": "replay.md",
    "confirm": "root-causes.md",
    "simulate": "replay.md",
    "serve": "dashboards.md",
    "report": "dashboards.md",
}


def page_path(page: str) -> str:
    """The page's path in a clone of the repository, as the help prints it."""
    return f"{DOCS_DIR}/{page}"


def docs_line(page: str) -> str:
    """The last line of a command's help."""
    return f"Docs: {page_path(page)}"


def _add_epilog(command: click.Command, page: str) -> None:
    line = docs_line(page)
    command.epilog = f"{command.epilog}\n\n{line}" if command.epilog else line
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _add_epilog(sub, page)


def link_command(name: str, command: click.Command) -> None:
    """End the help of the top-level command ``name`` (and of its subcommands) with its page.

    A command without an entry in ``PAGES`` gets the overview page, so no help is left without one.
    """
    _add_epilog(command, PAGES.get(name, INDEX))
