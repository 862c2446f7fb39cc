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
from collections.abc import Mapping
from pathlib import Path

import pytest
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


DEADLINE_ENV = "TRACEDAG_TESTS_DEADLINE"
DEFAULT_DEADLINE_SECONDS = 5400.0
"""A whole run's deadline: 90 min, against 13-17 min on CI and 49 min seen on a machine loaded by six others."""


class RunDeadline:
    """The whole run's guard (the process that runs the session: xdist's controller, or pytest with ``-n 0``).

    A test past ``--timeout`` ends its worker, and xdist starts another; but a worker stuck where no test
    timer runs (a fixture's teardown at the end of its module, the session's end) or a controller left
    waiting for a worker that never reports kept the run hanging until someone noticed. Past the deadline
    (``TRACEDAG_TESTS_DEADLINE`` seconds, 0: none) this says so on stderr with the tests still running, ends
    every process below the run (the workers and what they started) and exits with status 3.
    """

    def __init__(self, config, seconds: float) -> None:
        self.config, self.seconds = config, seconds
        self.running: dict[str, None] = {}  # started, not yet finished (insertion order)
        self.timer = threading.Timer(seconds, self._expired)
        self.timer.name = "tracedag run deadline"
        self.timer.daemon = True  # never keeps a finished run alive

    def pytest_runtest_logstart(self, nodeid, location) -> None:
        self.running[nodeid] = None

    def pytest_runtest_logfinish(self, nodeid, location) -> None:
        self.running.pop(nodeid, None)

    def pytest_unconfigure(self, config) -> None:
        self.timer.cancel()

    def _expired(self) -> None:
        still = "\n".join(f"  {n}" for n in list(self.running)) or "  (none: no test started or all ended)"
        try:
            capman = self.config.pluginmanager.getplugin("capturemanager")
            if capman:
                capman.suspend_global_capture(in_=True)  # to the terminal, not a test's captured output
            writer = self.config.get_terminal_writer()
            writer.line(f"\n!!! the test run passed its deadline of {self.seconds:g} s ({DEADLINE_ENV}); tests still "
                        f"running:\n{still}\nending the workers and every process they started", red=True, bold=True)
            writer.flush()
            end_descendants()
        finally:
            os._exit(3)


def deadline_seconds(environ: Mapping[str, str] = os.environ) -> float:
    """The run's deadline from ``TRACEDAG_TESTS_DEADLINE`` (seconds; 0 turns it off), else the default."""
    text = environ.get(DEADLINE_ENV, "").strip()
    if not text:
        return DEFAULT_DEADLINE_SECONDS
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0 or seconds == float("inf"):
        raise pytest.UsageError(f"{DEADLINE_ENV}={text!r}: give the whole run's deadline in seconds (0: none)")
    return seconds


def arm_run_deadline(config) -> None:
    """Start the run's deadline in the process that runs the session (not in an xdist worker)."""
    if hasattr(config, "workerinput"):
        return
    seconds = deadline_seconds()
    if seconds > 0:
        guard = RunDeadline(config, seconds)
        config.pluginmanager.register(guard, "tracedag-run-deadline")
        guard.timer.start()


def pytest_configure(config) -> None:
    """As a plugin (``-p tests.timeouts``; the suite's conftest calls ``arm_run_deadline`` itself)."""
    arm_run_deadline(config)
