"""CLI commands: collect."""

from __future__ import annotations

import click

COMMANDS: list[click.Command] = []
