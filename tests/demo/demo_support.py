"""``tracedag demo`` run once per test run, as a newcomer runs it, for every test that reads what it made.

The demo is the most expensive thing the suite builds (every stage of the product, from a collector and simulated
conversations to replays and an object-store round trip). Five test modules used to run it each; they now share one run (``tests/shared_dirs.py``: built once per run under a lock,
whatever the number of xdist workers) and each takes a private copy of the directory, so none can see another's
writes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.shared_dirs import copy_of, shared_dir

BIN = Path(sys.executable).parent
TIMEOUT = 300


def newcomer_env(**extra: str) -> dict[str, str]:
    """The environment of a user's shell: no TRACEDAG_* settings, this interpreter's bin/ first, wide lines."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEDAG_")}
    return {**env, "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}", "COLUMNS": "200", **extra}


@dataclass(frozen=True)
class DemoRun:
    """The directory the demo ran in (its store is ``cwd / "tracedag-demo"``) and what it printed."""

    cwd: Path
    output: str

    @property
    def data(self) -> Path:
        return self.cwd / "tracedag-demo"


def _run_demo(root: Path) -> None:
    """``tracedag demo`` in an empty directory (default seed and --data), its standard output kept beside it."""
    cwd = root / "newcomer"
    cwd.mkdir(parents=True)
    done = subprocess.run([str(BIN / "tracedag"), "demo"], cwd=cwd, env=newcomer_env(), capture_output=True,
                          text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stdout + done.stderr
    (root / "stdout.txt").write_text(done.stdout)


@pytest.fixture(scope="session")
def demo_newcomer(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    """The shared demo run (read-only: take ``private_demo`` to change it)."""
    root = shared_dir(tmp_path_factory, "demo", _run_demo)
    return DemoRun(root / "newcomer", (root / "stdout.txt").read_text())


def private_demo(shared: DemoRun, dest: Path) -> DemoRun:
    """A copy of the shared demo's directory at ``dest`` (the store keeps no absolute path: it moves whole)."""
    return DemoRun(copy_of(shared.cwd, dest), shared.output)
