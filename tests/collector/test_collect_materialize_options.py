"""``tracedag collect --materialize-part``: how many traces a pass of a live collector's results store takes at
most; ``--materialize-interval`` (the schedule before the store had a thread of its own) is still accepted, so
that existing service units start, and said to be ignored. A bad value is refused by name before anything is
created; a good one reaches the running collector's configuration (which it prints when it starts)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

TRACEDAG = str(Path(sys.executable).parent / "tracedag")


@pytest.mark.parametrize(("option", "value"), [
    ("--materialize-interval", "-1"), ("--materialize-interval", "nan"), ("--materialize-interval", "inf"),
    ("--materialize-interval", "soon"), ("--materialize-part", "0"), ("--materialize-part", "-5"),
    ("--materialize-part", "1.5"),
])
def test_a_bad_value_is_refused_naming_the_option_and_creates_nothing(tmp_path, option, value):
    data = tmp_path / "data"
    res = subprocess.run([TRACEDAG, "collect", "--data", str(data), "--http-port", "0", "--grpc-port", "0",
                          "--build", option, value], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"Invalid value for '{option}'" in res.stderr and value in res.stderr
    assert "Traceback" not in res.stderr
    assert not data.exists()


def test_the_values_reach_the_running_collector(tmp_path):
    proc = subprocess.Popen([TRACEDAG, "collect", "--data", str(tmp_path / "data"), "--http-port", "0",
                             "--grpc-port", "0", "--build", "--materialize-interval", "2.5", "--materialize-part",
                             "300"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("listening"):
                break
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    said = "".join(lines)
    assert re.search(r"results stored as scored, by a thread of their own, at most 300 traces a pass", said), said
    assert proc.returncode == 0, out + err
    assert "--materialize-interval is ignored" in err, err


def test_the_defaults_are_the_configs(tmp_path):
    from tracedag.pipeline.service import CollectorConfig

    res = subprocess.run([TRACEDAG, "collect", "--help"], capture_output=True, text=True, timeout=60)
    help_text = " ".join(res.stdout.split())
    defaults = CollectorConfig(data=tmp_path)
    assert "--materialize-interval" not in help_text  # accepted, ignored, not offered
    assert f"[default: {defaults.materialize_part}; x>=1]" in help_text
