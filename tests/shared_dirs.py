"""Directories built once per test run and shared by every test that needs them, whatever the number of
xdist workers.

A session-scoped fixture is built once per *worker*: under ``pytest -n 2`` a demo store would be made twice,
once in each worker. ``shared_dir`` builds it once per run instead. The first worker to ask builds it under a
file lock in the run's temporary directory (the parent of each worker's own ``basetemp``, so nothing is left in
a fixed place and two runs never share it); the others wait on the lock and get the same path.

Consumers treat a shared directory as read-only. A test that writes into one takes a ``copy_of`` it first.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest


def run_root(factory: pytest.TempPathFactory) -> Path:
    """The temporary directory of this run that every worker sees (the worker's own one without xdist)."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def shared_dir(factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """``run_root/shared-NAME``, made by ``build(path)`` once per run (``path`` does not exist yet).

    A build that fails leaves nothing behind: the next worker to ask tries again, and fails in its own test.
    """
    root = run_root(factory)
    target, built = root / f"shared-{name}", root / f"shared-{name}.built"
    with open(root / f"shared-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, even if the build raises
        if not built.exists():
            partial = root / f"shared-{name}.partial"
            shutil.rmtree(partial, ignore_errors=True)
            build(partial)
            partial.rename(target)
            built.touch()
    return target


def copy_of(shared: Path, dest: Path) -> Path:
    """A private copy of a shared directory, for a test that writes into it."""
    shutil.copytree(shared, dest, symlinks=True)
    return dest
