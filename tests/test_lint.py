"""ruff and mypy (strict on collector/, pipeline/, schemas/) are part of the tests."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True)


def test_ruff_clean():
    r = _run("ruff", "check", ".")
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_strict():
    r = _run("mypy", "collector", "pipeline", "schemas")
    assert r.returncode == 0, r.stdout + r.stderr
