"""A test that pytest-timeout ends leaves no process running (tests/timeouts.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from tests.timeouts import running

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
