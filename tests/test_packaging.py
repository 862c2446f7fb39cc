"""The fixed top level installs as one ``tracedag`` package; every subpackage is listed."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {"collector", "pipeline", "schemas", "queries"}


def _declared() -> set[str]:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return set(cfg["tool"]["setuptools"]["packages"])


def test_every_subpackage_is_listed_in_pyproject():
    found = set()
    for folder in FOLDERS:
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT).parts
            found.add(".".join(("tracedag", *rel)))
    assert found == _declared()


def test_package_dir_maps_every_package():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapping = cfg["tool"]["setuptools"]["package-dir"]
    for pkg in _declared():
        assert pkg in mapping, pkg
        assert (ROOT / mapping[pkg] / "__init__.py").exists()


def test_cli_imports_and_shows_help():
    from click.testing import CliRunner

    from tracedag.pipeline.cli import cli

    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    assert "tracedag" in result.output
