"""A command imports what it uses (#31, #33): start-up is most of a command's CPU on a small store.

``tracedag show`` and a ``tracedag build`` with nothing to do used to import the reconstruction (polars,
networkx, yaml: ~0.5 s CPU of ~1.5 s) through ``tracedag.pipeline.dag``'s ``__init__``; every command
imported ``importlib.metadata`` for ``--version``. Each check runs the CLI in a fresh interpreter and
lists the heavy modules it had imported when the command returned.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.gen import make_store
from tracedag.pipeline.dag.build import build_store
from tracedag.pipeline.store.views import connect

RECONSTRUCTION = ("polars", "networkx", "yaml", "tracedag.pipeline.dag.reconstruct")
CHILD = """
import json, sys
from tracedag.pipeline.cli import cli
try:
    cli(sys.argv[2:], standalone_mode=False)
finally:
    with open(sys.argv[1], "w") as fh:
        json.dump(sorted(sys.modules), fh)
"""


def imported(tmp_path: Path, *args: str) -> tuple[set[str], str]:
    """The modules a CLI process had imported once ``tracedag ARGS`` returned, and its output."""
    listing = tmp_path / "modules.json"
    done = subprocess.run([sys.executable, "-c", CHILD, str(listing), *args], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return set(json.loads(listing.read_text())), done.stdout + done.stderr


def test_the_cli_module_imports_no_data_library(tmp_path: Path) -> None:
    code = "import json, sys; import tracedag.pipeline.cli; print(json.dumps(sorted(sys.modules)))"
    loaded = set(json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                           check=True, timeout=60).stdout))
    assert not loaded & {"duckdb", "pyarrow", "numpy", "polars", "networkx", "importlib.metadata"}


def test_version_still_says_the_installed_version(tmp_path: Path) -> None:
    from importlib.metadata import version

    _, out = imported(tmp_path, "--version")
    assert out.strip() == f"tracedag, version {version('tracedag')}"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    data = tmp_path_factory.mktemp("cli-imports") / "store"
    make_store(data, 300, seed=3)
    build_store(data, idle_seconds=0.0)
    con = connect(data)
    try:
        trace = str(con.sql("select trace_id from traces order by trace_id limit 1").fetchall()[0][0])
    finally:
        con.close()
    return data, trace


def test_a_build_with_nothing_to_do_does_not_import_the_reconstruction(tmp_path: Path,
                                                                       built: tuple[Path, str]) -> None:
    loaded, out = imported(tmp_path, "build", "--idle", "0", "--data", str(built[0]))
    assert "nothing changed since the last build" in out
    assert not loaded & set(RECONSTRUCTION)


def test_show_does_not_import_the_build(tmp_path: Path, built: tuple[Path, str]) -> None:
    data, trace = built
    loaded, out = imported(tmp_path, "show", trace, "--data", str(data))
    assert trace in out
    assert not loaded & {*RECONSTRUCTION, "tracedag.pipeline.dag.build"}


def test_the_dag_package_still_gives_its_names() -> None:
    from tracedag.pipeline import dag
    from tracedag.pipeline.dag.build import BuildStats

    assert dag.BuildStats is BuildStats and callable(dag.build_store)
    with pytest.raises(AttributeError):
        dag.nothing_here  # noqa: B018


def test_each_command_is_found_in_the_module_the_group_imports_for_it() -> None:
    import importlib

    from tracedag.pipeline.cli import HOMES

    here = Path(importlib.import_module("tracedag.pipeline.commands").__file__ or "").parent
    names = {p.stem for p in here.glob("*.py") if not p.stem.startswith("_")}
    modules = {m: importlib.import_module(f"tracedag.pipeline.commands.{m}") for m in names}
    modules = {m: module for m, module in modules.items() if hasattr(module, "COMMANDS")}
    listed = {c.name: m for m, module in modules.items() for c in module.COMMANDS}
    assert listed == HOMES


def test_a_command_imports_its_module_alone(tmp_path: Path) -> None:
    loaded, out = imported(tmp_path, "queries")
    assert "root_causes" in out
    commands = {m for m in loaded if m.startswith("tracedag.pipeline.commands.") and not m.split(".")[-1].startswith("_")}
    assert commands == {"tracedag.pipeline.commands.query"}
