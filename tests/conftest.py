"""The one conftest of the suite: the shared fixtures, by name, and the rule for slow tests.

Tests import their helpers as ``tests.<area>.<module>`` (pytest runs with ``--import-mode=importlib``
and the repository root on its ``pythonpath``, set in pyproject.toml); nothing edits ``sys.path``.
"""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

import pytest

from tests.analysis.analysis_support import store
from tests.collector.collector_support import collector, small_collector
from tests.demo.demo_support import demo_newcomer
from tests.ingest.ingest_support import data
from tests.ordering import load_weights, sort_by_weight
from tests.pinned_venv import start_prebuild
from tests.queries.query_store import query_store
from tests.queries.rca_store import rca_store
from tests.score.score_support import builder
from tests.serve.serve_support import plain_server, serve_store
from tests.store.objfixtures import quick_worker_server
from tests.store.s3_server import s3, s3_module_server
from tests.timeouts import arm_run_deadline, pytest_timeout_set_timer

__all__ = ["builder", "collector", "data", "demo_newcomer", "pytest_timeout_set_timer", "query_store", "rca_store", "s3",
           "plain_server", "quick_worker_server", "s3_module_server", "serve_store", "small_collector", "store"]


VENV_EXTRA = 300
"""Seconds a test of a module with ``PINNED_VENVS`` (tests/pinned_venv.py) may take beyond its venvs' pip timeout."""


def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (pyproject's addopts): one worker more than the cores this process may run on. A third of the
    suite's time is waiting (servers starting, exporters' backoff, a collector's rounds), which the worker beyond
    the cores fills with other files' CPU. On 2 cores, fresh clone, pytest wall: 3 workers 8:02, 8:02, 8:13; 4
    workers 7:38, 8:27, 8:21 for 40 s more CPU than 3 (each worker also collects the suite: 5-10 s of CPU)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1  # macOS: no
    return cores + 1


def pytest_configure(config):
    """The ``tracedag`` command of the interpreter that runs the tests comes first on PATH.

    ``VENV/bin/python -m pytest`` without an activated venv must find VENV's ``tracedag`` (and every
    subprocess a test starts inherits this PATH), never another installation's or none. The run also gets
    its deadline (``TRACEDAG_TESTS_DEADLINE``, tests/timeouts.py), and ``-m slow`` draws the property tests'
    whole budgets (``TRACEDAG_FUZZ=full``, tests/fuzzing.py; xdist workers inherit it).
    """
    if "slow" in (config.getoption("-m") or ""):
        os.environ["TRACEDAG_FUZZ"] = "full"
    own_bin = str(Path(sys.executable).parent)
    parts = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != own_bin]
    os.environ["PATH"] = os.pathsep.join([own_bin, *parts])
    _bytecode_outside_the_tree()
    arm_run_deadline(config)  # the whole run's guard (tests/timeouts.py)


def _bytecode_outside_the_tree() -> None:
    """Under ``PYTHONDONTWRITEBYTECODE`` (no ``.pyc`` beside the sources) every process of the run compiled every
    module it imported again, and pytest rewrote every test module's asserts again in each worker: up to a fifth
    of the suite's CPU (a CLI-heavy test file 23.6 -> 18.9 s CPU, collecting the suite 12.3 -> 6.1 s per worker).
    The run's processes (xdist workers, which start after this, and the commands tests start) compile into a
    cache in the user's own cache directory instead (``~/.cache/tracedag-tests/pycache``, mode 0700: never a
    shared temporary directory, where another user could plant bytecode), kept between runs; the tree still
    gets no ``.pyc``. A ``PYTHONPYCACHEPREFIX`` already set is left alone."""
    if not os.environ.get("PYTHONDONTWRITEBYTECODE") or os.environ.get("PYTHONPYCACHEPREFIX"):
        return
    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    prefix = str(home / "tracedag-tests" / "pycache")
    try:
        os.makedirs(prefix, mode=0o700, exist_ok=True)
    except OSError:
        return  # no writable cache directory: compile as before
    del os.environ["PYTHONDONTWRITEBYTECODE"]
    os.environ["PYTHONPYCACHEPREFIX"] = prefix
    sys.dont_write_bytecode = False
    sys.pycache_prefix = prefix


def pytest_collection_modifyitems(config, items):
    """The longest test files start first (tests/ordering.py); a test of a module that needs a pinned venv may
    build it or wait for its build (330-350 s under load 10, past the suite's 300 s timeout, which ended the
    xdist worker): it gets the venvs' pip timeout plus ``VENV_EXTRA``; slow soak, crash-loop and fuzzing tests run
    only when asked for with ``-m slow``."""
    sort_by_weight(items, load_weights())
    for item in items:
        venvs = getattr(getattr(item, "module", None), "PINNED_VENVS", None)
        if venvs and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(max(v.pip_timeout for v in venvs) + VENV_EXTRA))
    if "slow" in (config.getoption("-m") or ""):
        return
    keep, drop = [], []
    for item in items:
        (drop if item.get_closest_marker("slow") else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_collection_finish(session):
    """The pinned venvs the selected tests need and that are missing are built in the background from now on
    (tests/pinned_venv.py), so their downloads overlap the tests that need none."""
    start_prebuild(session)


def pytest_sessionfinish(session):
    """An xdist worker collects its garbage once, then freezes what is left, before it reports that it finished.

    Once the last worker reports, the controller asks every worker to exit and sends it SIGINT if it still runs
    5 s later (execnet). After the report, pytest collects the garbage of the whole session twice (to catch
    unraisable exceptions); on a worker's heap after hundreds of tests, under load, that took longer, and the
    SIGINT landed in hypothesis' gc callback (a ``KeyboardInterrupt`` warning at the end of a full run). Done
    here, before the report, the collection is not timed by anyone, and pytest's two collect only what came
    after it."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        gc.collect()
        gc.freeze()
