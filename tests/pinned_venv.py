"""Cached virtualenvs for real client libraries that cannot be installed beside this project.

Some real clients pin an OpenTelemetry SDK other than this project's (traceloop-sdk, the 1.44
HTTP exporter, the OTLP/JSON exporter): they run out of process, from a virtualenv holding an
exactly pinned set (a ``*_requirements.txt`` lock file beside the test). A venv is created once
(``sys.executable -m venv`` + its pip, from PyPI) and cached under
``~/.cache/tracedag-tests/<name>-<pin>-py<X.Y>-<hash of the lock>``. It is built in a temporary
directory, checked importable, stamped, then renamed into place, so a half-built venv is never
used. A venv that cannot be built (PyPI unreachable) fails the test with pip's message: it is
never skipped.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

STAMP = "tracedag-lock.txt"
PIP_TIMEOUT = 420


@dataclass(frozen=True)
class PinnedVenv:
    """A venv named ``name`` holding the pins of ``lock``, in which ``imports`` must import."""

    name: str
    lock: Path
    package: str  # the pinned package whose version names the venv
    imports: str  # e.g. "import openai, traceloop.sdk.decorators"
    pip_timeout: float = PIP_TIMEOUT  # seconds for the install (google-adk's ~90 packages take ~6 min on 2 busy cores)

    def version(self) -> str:
        """The version of ``package`` pinned in the lock file."""
        found = re.search(rf"^{re.escape(self.package)}==(\S+)$", self.lock.read_text(), re.MULTILINE)
        assert found, f"{self.lock} pins no {self.package} version"
        return found.group(1)

    def directory(self) -> Path:
        """Where the venv of this lock file and this Python lives (a new lock gets a new venv)."""
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tracedag-tests"
        digest = hashlib.sha256(self.lock.read_bytes()).hexdigest()[:12]
        py = f"{sys.version_info.major}.{sys.version_info.minor}"
        return cache / f"{self.name}-{self.version()}-py{py}-{digest}"

    def usable(self, venv: Path) -> bool:
        """True when ``venv`` is complete (its stamp, written last, holds this lock) and its python resolves."""
        stamp = venv / STAMP
        if not (stamp.is_file() and python_of(venv).exists()):
            return False
        return stamp.read_text() == self.lock.read_text()

    def build(self, target: Path) -> None:
        """Create a venv at ``target`` with the pinned set installed, checked importable, then stamped."""
        run_or_fail([sys.executable, "-m", "venv", str(target)], f"creating the {self.name} virtualenv", 120)
        py = str(python_of(target))
        pip = [py, "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "-q", "-r", str(self.lock)]
        run_or_fail(pip, f"installing {self.package}=={self.version()} from PyPI", self.pip_timeout)
        run_or_fail([py, "-c", self.imports], f"importing {self.package} in its venv", 120)
        (target / STAMP).write_text(self.lock.read_text())

    def ensure(self) -> Path:
        """The python of the cached venv, built first when missing (atomically: temp dir, rename).

        Only ``bin/python`` is used after the rename: it finds its site-packages through the
        ``pyvenv.cfg`` beside it, whereas the venv's console scripts keep the build path in their shebang.
        """
        final = self.directory()
        if self.usable(final):
            return python_of(final)
        final.parent.mkdir(parents=True, exist_ok=True)
        remove_abandoned_builds(final.parent)
        work = Path(tempfile.mkdtemp(prefix=".build-", dir=final.parent))
        try:
            self.build(work / "venv")
            if self.usable(final):  # a concurrent run published first: use its venv
                return python_of(final)
            if final.exists():  # incomplete or stale: moved aside, then removed with the work dir
                final.rename(work / "stale")
            (work / "venv").rename(final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return python_of(final)


def python_of(venv: Path) -> Path:
    """The interpreter of ``venv``."""
    return venv / "bin" / "python"


def run_or_fail(cmd: list[str], what: str, timeout: float) -> None:
    """Run ``cmd``; on failure or timeout fail the test with its output (never a skip)."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{what} timed out after {timeout:.0f} s (is PyPI reachable?): {' '.join(cmd)}\n"
                    f"{exc.stderr}")
    if done.returncode != 0:
        noise = "is ignored: it is neither a file nor a directory"
        err = "\n".join(line for line in done.stderr.splitlines() if noise not in line)
        pytest.fail(f"{what} failed (exit {done.returncode}; is PyPI reachable?): {' '.join(cmd)}\n"
                    f"{err[-4000:]}\n{done.stdout[-2000:]}")


def remove_abandoned_builds(cache: Path, age_seconds: float = 3600) -> None:
    """Remove the build directories of runs killed mid-build (older than ``age_seconds``)."""
    for old in cache.glob(".build-*"):
        if time.time() - old.stat().st_mtime > age_seconds:
            shutil.rmtree(old, ignore_errors=True)


def client_env() -> dict[str, str]:
    """An out-of-process client's environment: no inherited OTel settings, PYTHON* variables or proxies."""
    drop = ("OTEL_", "TRACELOOP_", "PYTHON")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop) and "proxy" not in k.lower()}
    env["NO_PROXY"] = "127.0.0.1,localhost"
    return env
