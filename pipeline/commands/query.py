"""CLI commands: query."""

from __future__ import annotations

import click

COMMANDS: list[click.Command] = []
