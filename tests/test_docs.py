"""README documents every named query, every TRACEDAG_* variable and every CLI command."""

import re
from pathlib import Path

from click.testing import CliRunner

from tracedag import queries
from tracedag.pipeline.cli import cli

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
CODE_DIRS = ("collector", "pipeline", "schemas", "queries")


def test_every_named_query_is_in_readme():
    missing = [name for name in queries.names() if f"`{name}`" not in README]
    assert not missing, missing


def test_every_environment_variable_is_in_readme():
    found = set()
    for top in CODE_DIRS:
        for path in (ROOT / top).rglob("*.py"):
            found |= set(re.findall(r"TRACEDAG_[A-Z][A-Z_]*[A-Z]", path.read_text(encoding="utf-8")))
    missing = sorted(v for v in found if v not in README)
    assert not missing, missing


def test_every_command_is_in_readme():
    missing = [name for name in cli.list_commands(None) if f"tracedag {name}" not in README]  # type: ignore[arg-type]
    assert not missing, missing


def test_readme_quickstart_has_exactly_the_two_commands():
    block = README.split("## Quickstart", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    lines = [ln for ln in block.strip().splitlines() if ln.strip()]
    assert len(lines) == 2
    assert "tracedag demo" in lines[0] and "pytest" in lines[1]


def test_every_command_has_help():
    for name in cli.list_commands(None):  # type: ignore[arg-type]
        result = CliRunner().invoke(cli, [name, "--help"])
        assert result.exit_code == 0, (name, result.output)
