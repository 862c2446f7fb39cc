"""The fixed top level installs as one ``tracedag`` package; every subpackage is listed."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("collector", "pipeline", "schemas", "queries")


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_folder_is_mapped_to_a_listed_package():
    mapped = {folder: pkg for pkg, folder in _setuptools()["package-dir"].items()}
    found = set()
    for top in FOLDERS:
        for init in (ROOT / top).rglob("__init__.py"):
            folder = init.parent.relative_to(ROOT).as_posix()
            assert folder in mapped, f"{folder} has an __init__.py but no package-dir entry"
            found.add(mapped[folder])
    assert found == set(_setuptools()["packages"])


def test_package_dir_points_at_real_folders():
    for pkg, folder in _setuptools()["package-dir"].items():
        assert pkg in _setuptools()["packages"], pkg
        assert (ROOT / folder / "__init__.py").exists(), folder


def test_cli_imports_and_shows_help():
    from click.testing import CliRunner

    from tracedag.pipeline.cli import cli

    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    assert "tracedag" in result.output


def test_test_module_basenames_are_unique():
    # one name per test module keeps -k selections and reports unambiguous (tests/ has no __init__.py)
    names = [p.name for p in (ROOT / "tests").rglob("test_*.py")]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
