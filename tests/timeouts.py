"""A test that runs out of time leaves no process behind.

pytest-timeout's thread method ends a test that outlives ``--timeout`` by dumping every thread's stack and
calling ``os._exit``: no fixture teardown runs, so a ``tracedag serve``, collector, SeaweedFS or agent the test
started (often in a session of its own, ``start_new_session``) kept running, holding its port, store and CPU,
for the rest of the run and after it (four such servers were found running hours later). The suite's
``pytest_timeout_set_timer`` (tests/conftest.py) arms the same timer, whose handler first ends every
descendant of the worker (the process groups the test's children lead, whole, and the other children one by
one: SIGTERM, then SIGKILL after a grace), then lets pytest-timeout dump the stacks and exit as before.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path

import pytest_timeout

GRACE_SECONDS = 3.0
"""How long the processes get to exit on SIGTERM before SIGKILL."""


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process now running (Linux /proc)."""
    found: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue  # ended meanwhile
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'
            found[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return found


def descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (children first, then theirs)."""
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def running(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, ended but not yet reaped, does not count)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _signal_all(pids: list[int], groups: set[int], sig: int) -> None:
    for group in groups:
        with contextlib.suppress(OSError):  # the group ended meanwhile
            os.killpg(group, sig)
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, sig)


def end_descendants(grace: float = GRACE_SECONDS) -> list[int]:
    """End every process below this one: SIGTERM to each descendant's process group when it is not ours
    (a server started with ``start_new_session`` and its workers), else to the process; SIGKILL to what still
    runs after ``grace`` seconds. Returns the processes signalled."""
    own_group = os.getpgid(0)
    pids = descendants(os.getpid())
    groups: set[int] = set()
    for pid in pids:
        try:
            group = os.getpgid(pid)
        except OSError:
            continue
        if group != own_group:
            groups.add(group)
    _signal_all(pids, groups, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(running(p) for p in pids):
        time.sleep(0.05)
    _signal_all([p for p in pids if running(p)], groups, signal.SIGKILL)
    return pids


def _timed_out(item, settings) -> None:
    """pytest-timeout's thread-method handler, after the test's processes are ended (see the module)."""
    try:
        end_descendants()
    finally:
        pytest_timeout.timeout_timer(item, settings)  # dumps the stacks, then os._exit(1)


def pytest_timeout_set_timer(item, settings):
    """Arm the thread method's timer with a handler that ends the test's processes first (the signal
    method is left to pytest-timeout: its exception unwinds the test, so the fixtures' teardown runs)."""
    if settings.method != "thread":
        return None
    timer = threading.Timer(settings.timeout, _timed_out, (item, settings))
    timer.name = f"pytest_timeout {item.nodeid}"

    def cancel() -> None:
        timer.cancel()
        timer.join()

    item.cancel_timeout = cancel
    timer.start()
    return True
