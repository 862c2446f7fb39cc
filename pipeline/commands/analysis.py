"""CLI commands: analysis."""

from __future__ import annotations

import click

COMMANDS: list[click.Command] = []
