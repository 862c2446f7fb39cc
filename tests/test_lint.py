"""ruff and mypy (strict on collector/, pipeline/, schemas/) are part of the tests."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# How the folders install (pyproject's package-dir); mypy cannot follow the editable finder.
PACKAGE = {"collector": "collector", "pipeline": "pipeline", "schemas": "schemas", "queries": "queries",
           "instrument": "pipeline/instrument", "testing": "pipeline/testing"}


def _run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True)


def test_ruff_clean():
    r = _run("ruff", "check", ".")
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_strict_over_the_installed_package(tmp_path):
    # Lay the folders out as the installed ``tracedag`` package (symlinks), so that imports between
    # modules are checked with their real types instead of resolving to Any.
    pkg = tmp_path / "tracedag"
    pkg.mkdir()
    for name, folder in PACKAGE.items():
        (pkg / name).symlink_to(ROOT / folder, target_is_directory=True)
    r = _run("mypy", "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(ROOT / ".mypy_cache"),
             "-p", "tracedag.collector", "-p", "tracedag.pipeline", "-p", "tracedag.schemas",
             "-p", "tracedag.instrument", "-p", "tracedag.testing",
             "--exclude", "tracedag/pipeline/(instrument|testing)/", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
