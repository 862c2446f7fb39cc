"""Cached virtualenvs for real client libraries that cannot be installed beside this project.

Some real clients pin an OpenTelemetry SDK other than this project's (traceloop-sdk, the 1.44
HTTP exporter, the OTLP/JSON exporter): they run out of process, from a virtualenv holding an
exactly pinned set (a ``*_requirements.txt`` lock file beside the test). A venv is created once and
cached under ``~/.cache/tracedag-tests/<name>-<pin>-py<X.Y>-<hash of the lock>``. It is built in a
temporary directory, checked complete and importable, stamped, then renamed into place, so a
half-built venv is never used; one process builds it at a time (a lock file beside it), the others
wait and use it. A venv that cannot be built (PyPI unreachable) fails the test with pip's message:
it is never skipped.

Building is cheap on pip's side: the lock pins every package, so pip installs it as is (``--no-deps``:
no resolver) and ``pip check`` proves nothing is missing; nothing is byte-compiled at install
(``--no-compile``: a client compiles what it imports, once); and the venv gets no pip of its own
(``--without-pip``: no ``ensurepip``), the test interpreter's pip installs into it (``--python``).
At the start of a run, the venvs the selected tests need and that are missing are built in the
background, one at a time, by a child process (``start_prebuild``), so their downloads overlap the
tests that need none.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest

STAMP = "tracedag-lock.txt"
PIP_TIMEOUT = 420
QUIET = ["--disable-pip-version-check", "--no-input", "-q"]


@dataclass(frozen=True)
class PinnedVenv:
    """A venv named ``name`` holding the pins of ``lock``, in which ``imports`` must import."""

    name: str
    lock: Path
    package: str  # the pinned package whose version names the venv
    imports: str  # e.g. "import openai, traceloop.sdk.decorators"
    pip_timeout: float = PIP_TIMEOUT  # seconds for the install (google-adk's ~90 packages took ~6 min on 2 busy cores)

    def version(self) -> str:
        """The version of ``package`` pinned in the lock file."""
        found = re.search(rf"^{re.escape(self.package)}==(\S+)$", self.lock.read_text(), re.MULTILINE)
        assert found, f"{self.lock} pins no {self.package} version"
        return found.group(1)

    def directory(self) -> Path:
        """Where the venv of this lock file and this Python lives (a new lock gets a new venv)."""
        digest = hashlib.sha256(self.lock.read_bytes()).hexdigest()[:12]
        py = f"{sys.version_info.major}.{sys.version_info.minor}"
        return cache_dir() / f"{self.name}-{self.version()}-py{py}-{digest}"

    def usable(self, venv: Path) -> bool:
        """True when ``venv`` is complete (its stamp, written last, holds this lock) and its python resolves."""
        stamp = venv / STAMP
        if not (stamp.is_file() and python_of(venv).exists()):
            return False
        return stamp.read_text() == self.lock.read_text()

    def build(self, target: Path) -> None:
        """Create a venv at ``target`` with the pinned set installed, checked complete and importable, then stamped."""
        pip = host_pip()
        if pip is None:  # the test interpreter's pip cannot install elsewhere: the venv gets its own
            run_or_fail([sys.executable, "-m", "venv", str(target)], f"creating the {self.name} virtualenv", 120)
            pip = [str(python_of(target)), "-m", "pip"]
        else:
            run_or_fail([sys.executable, "-m", "venv", "--without-pip", str(target)],
                        f"creating the {self.name} virtualenv", 120)
            pip = [*pip, "--python", str(python_of(target))]
        install = [*pip, "install", *QUIET, "--no-deps", "--no-compile", "-r", str(self.lock)]
        run_or_fail(install, f"installing {self.package}=={self.version()} from PyPI", self.pip_timeout)
        run_or_fail([*pip, "check"], f"checking that {self.lock.name} pins every dependency (pip check)", 120)
        run_or_fail([str(python_of(target)), "-c", self.imports], f"importing {self.package} in its venv", 120)
        (target / STAMP).write_text(self.lock.read_text())

    def ensure(self) -> Path:
        """The python of the cached venv, built first when missing (atomically: temp dir, rename).

        The build holds the venv's lock file: a second process (another xdist worker, the background
        build) waits for it, then uses its venv. Only ``bin/python`` is used after the rename: it finds
        its site-packages through the ``pyvenv.cfg`` beside it, whereas console scripts keep the build path.
        """
        final = self.directory()
        if self.usable(final):
            return python_of(final)
        final.parent.mkdir(parents=True, exist_ok=True)
        with locked(final.parent / f".{final.name}.lock"):
            if self.usable(final):  # built by another process while this one waited
                return python_of(final)
            remove_abandoned_builds(final.parent)
            self.build_into(final)
        return python_of(final)

    def build_into(self, final: Path) -> None:
        """Build in a temporary directory beside ``final``, then rename it into place."""
        work = Path(tempfile.mkdtemp(prefix=".build-", dir=final.parent))
        try:
            self.build(work / "venv")
            if final.exists():  # incomplete or stale: moved aside, then removed with the work dir
                final.rename(work / "stale")
            (work / "venv").rename(final)
        finally:
            shutil.rmtree(work, ignore_errors=True)


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/tracedag-tests`` (``~/.cache/tracedag-tests``)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tracedag-tests"


def python_of(venv: Path) -> Path:
    """The interpreter of ``venv``."""
    return venv / "bin" / "python"


def host_pip() -> list[str] | None:
    """The test interpreter's pip when it can install into another interpreter (``--python``: pip >= 22.3)."""
    try:
        found = re.match(r"(\d+)\.(\d+)", metadata.version("pip"))
    except metadata.PackageNotFoundError:
        return None
    if found is None or (int(found.group(1)), int(found.group(2))) < (22, 3):
        return None
    return [sys.executable, "-m", "pip"]


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created, never removed), waiting for whoever holds it."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


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


# ----------------------------------------------------------------------------------------------
# Building the run's missing venvs in the background
# ----------------------------------------------------------------------------------------------


def needed(items: Sequence[pytest.Item]) -> list[PinnedVenv]:
    """The venvs the modules of ``items`` declare (``PINNED_VENVS``), in the order the items come."""
    out: dict[str, PinnedVenv] = {}
    for module in dict.fromkeys(getattr(item, "module", None) for item in items):
        for venv in getattr(module, "PINNED_VENVS", ()):
            out.setdefault(venv.name, venv)
    return list(out.values())


class Prebuild:
    """The child process building the missing venvs one at a time; ended with the session if still running."""

    def __init__(self, venvs: Sequence[PinnedVenv]) -> None:
        spec = json.dumps([{**dataclasses.asdict(v), "lock": str(v.lock)} for v in venvs])
        log = cache_dir() / "prebuild.log"
        with open(log, "w") as out:  # what the builds printed, for whoever wonders; the tests report failures
            self.process = subprocess.Popen([sys.executable, __file__, spec], stdin=subprocess.DEVNULL, stdout=out,
                                            stderr=subprocess.STDOUT, start_new_session=True)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """An interrupted run ends the builds; otherwise every venv left is needed by a test still running
        on another worker, so this worker waits for them (the run's deadline still bounds it)."""
        if session.shouldstop or session.shouldfail:
            self.stop()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=1800)
        self.stop()

    def stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(self.process.pid, 15)
            self.process.wait()


def start_prebuild(session: pytest.Session) -> None:
    """Build the venvs the selected tests need and that are missing, in the background (one process per run:
    the only process when not under xdist, else worker gw0; a second run's builds wait on the venvs' locks)."""
    config = session.config
    if config.option.collectonly or os.environ.get("PYTEST_XDIST_WORKER", "gw0") != "gw0":
        return
    missing = [v for v in needed(session.items) if not v.usable(v.directory())]
    if missing:
        cache_dir().mkdir(parents=True, exist_ok=True)
        config.pluginmanager.register(Prebuild(missing), "tracedag-pinned-venvs-prebuild")


def main(spec: str) -> None:
    """Ensure each venv of ``spec`` (JSON), in order; a failure is printed, the test that needs it rebuilds."""
    for fields in json.loads(spec):
        venv = PinnedVenv(**{**fields, "lock": Path(fields["lock"])})
        started = time.monotonic()
        try:
            venv.ensure()
        except (Exception, pytest.fail.Exception) as exc:
            print(f"{venv.name}: {exc}", flush=True)
            continue
        print(f"{venv.name}: ready after {time.monotonic() - started:.1f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
