"""A test that pytest-timeout ends leaves no process running (tests/timeouts.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.timeouts import DEADLINE_ENV, DEFAULT_DEADLINE_SECONDS, deadline_seconds, running

ROOT = Path(__file__).resolve().parents[1]

# A server started in a session of its own with a worker of its own (as `tracedag serve` and its SQL workers),
# and a plain child in the test's process group; the test then outlives its time.
_SLOW_TEST = '''
import json, subprocess, sys, time
from pathlib import Path

SERVER = """
import json, subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(json.dumps([worker.pid]), flush=True)
time.sleep(600)
"""

def test_outlives_its_time():
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, start_new_session=True)
    worker = json.loads(server.stdout.readline())
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    Path(PIDS).write_text(json.dumps([server.pid, *worker, plain.pid]))
    time.sleep(600)
'''


def test_a_timed_out_test_leaves_none_of_its_processes_running(tmp_path):
    """pytest-timeout (thread method, as the suite runs) ends the slow test; the server it started in its own
    session, that server's worker and the test's plain child are all gone right after (before: all three
    kept running after the run ended)."""
    pids_file = tmp_path / "pids.json"
    slow = tmp_path / "test_slow.py"
    slow.write_text(f"PIDS = {str(pids_file)!r}\n{_SLOW_TEST}")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", "/dev/null", "--rootdir", str(tmp_path), "-p", "no:cacheprovider",
         "-p", "tests.timeouts", "-o", "timeout_method=thread", "--timeout", "5", "-q", str(slow)],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "Timeout" in run.stdout + run.stderr, run.stdout + run.stderr
    pids = json.loads(pids_file.read_text())
    assert len(pids) == 3
    deadline = time.monotonic() + 10
    while any(running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = [p for p in pids if running(p)]
    try:
        assert alive == [], f"still running after the timeout: {alive}"
    finally:
        for p in alive:  # do not leave them to the rest of the run either
            subprocess.run(["kill", "-9", str(p)], check=False)


_STUCK_TEST = '''
import json, subprocess, sys, time
from pathlib import Path

def test_stuck():
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    Path(PIDS).write_text(json.dumps([server.pid]))
    time.sleep(600)
'''


def test_a_run_past_its_deadline_says_what_was_running_and_ends_every_process(tmp_path):
    """A worker stuck where no test timer runs (here: no --timeout at all) no longer hangs the run: past
    TRACEDAG_TESTS_DEADLINE the controller names the test still running, ends the worker and the server the
    test started, and the run exits with status 3."""
    pids_file = tmp_path / "pids.json"
    stuck = tmp_path / "test_stuck.py"
    stuck.write_text(f"PIDS = {str(pids_file)!r}\n{_STUCK_TEST}")
    env = {**os.environ, DEADLINE_ENV: "8"}
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", "/dev/null", "--rootdir", str(tmp_path), "-p", "no:cacheprovider",
         "-p", "tests.timeouts", "-n", "1", "--timeout", "0", "-q", str(stuck)],
        cwd=ROOT, capture_output=True, text=True, timeout=240, env=env)
    output = run.stdout + run.stderr
    assert run.returncode == 3, output
    assert "passed its deadline of 8 s" in output and "test_stuck.py::test_stuck" in output, output
    assert time.monotonic() - started < 200
    server = json.loads(pids_file.read_text())[0]
    deadline = time.monotonic() + 10
    while running(server) and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        assert not running(server)
    finally:
        if running(server):
            subprocess.run(["kill", "-9", str(server)], check=False)


def test_the_deadline_is_read_from_the_environment_and_a_bad_one_is_refused():
    assert deadline_seconds({}) == DEFAULT_DEADLINE_SECONDS
    assert deadline_seconds({DEADLINE_ENV: " 90 "}) == 90.0
    assert deadline_seconds({DEADLINE_ENV: "0"}) == 0.0  # none
    for bad in ("ten", "-5", "nan", "inf"):
        with pytest.raises(pytest.UsageError, match=f"{DEADLINE_ENV}='{bad}': give the whole run's deadline in seconds"):
            deadline_seconds({DEADLINE_ENV: bad})
