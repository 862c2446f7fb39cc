"""Spool -> Parquet conversion in child processes, off the receivers' interpreter (and GIL).

Each child is a plain ``python -P -m tracedag.pipeline.ingest.child`` process (see that module)
started with ``subprocess.Popen``: no multiprocessing, hence no resource-tracker process, no
semaphore and no spawn bootstrap. Each child converts the oldest sealed segment no other child has
claimed (a ``flock`` on the segment; see ``pipeline.ingest.claim``); child ``w`` of N writes its
metrics to ``<data>/state/converter.metrics[.w]`` (merged into the parent's ``/metrics``). Its stdin is a pipe from the parent: closing it is the stop signal (the child
converts what is left, then exits). The child dies with its parent (``PR_SET_PDEATHSIG`` plus a
parent-pid check); its stderr is the parent's. ``flush`` waits until no sealed segment is left,
i.e. everything sealed so far is in Parquet (or quarantined).
"""

from __future__ import annotations

import logging
import os
import queue
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path

from tracedag.collector.spoolfmt import DONE_RETENTION_SECONDS, SEALED_SUFFIX
from tracedag.pipeline.ingest.child import METRICS_FILE, metrics_name
from tracedag.schemas.layout import spool_dir, state_file

logger = logging.getLogger(__name__)

__all__ = ["ENV_CONVERTERS", "METRICS_FILE", "ConverterProcess", "default_processes", "merge_metrics"]

ENV_CONVERTERS = "TRACEDAG_CONVERTERS"
"""Number of converter processes (default 2); each claims the next sealed segment no other one holds."""

CHILD_MODULE = "tracedag.pipeline.ingest.child"
KILL_WAIT_SECONDS = 5.0


def default_processes() -> int:
    """Converter processes to run: ``$TRACEDAG_CONVERTERS`` or 2 (capped by the CPU count)."""
    try:
        return max(1, int(os.environ.get(ENV_CONVERTERS, "")))
    except ValueError:
        return max(1, min(2, os.cpu_count() or 1))


def child_env() -> dict[str, str]:
    """The converters' environment: ours, with glibc malloc held to 2 arenas unless set (the
    converters' Arrow threads otherwise each grow an arena, and freed memory stays split among them)."""
    env = dict(os.environ)
    env.setdefault("MALLOC_ARENA_MAX", "2")
    return env


Child = subprocess.Popen[bytes]
_Request = tuple[list[str], Future[Child]]


class _Launcher:
    """One long-lived thread that starts every child.

    ``PR_SET_PDEATHSIG`` fires when the *thread* that started a child ends, not the process: a child
    restarted from a short-lived thread (the server's supervisor ends before the final conversion)
    would be killed with that thread. Starting all children here ties them to this thread, which
    lives until ``close``.
    """

    def __init__(self) -> None:
        self._requests: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="converter-launcher", daemon=True)
        self._thread.start()

    def popen(self, args: list[str]) -> Child:
        """Start ``args`` from the launcher thread (stdin a pipe, stdout discarded, stderr shared)."""
        future: Future[Child] = Future()
        self._requests.put((args, future))
        return future.result()

    def close(self) -> None:
        """End the thread (only once its children have ended: their death signal is tied to it)."""
        self._requests.put(None)

    def _serve(self) -> None:
        while (request := self._requests.get()) is not None:
            args, future = request
            try:
                future.set_result(subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                                    env=child_env()))
            except OSError as exc:
                future.set_exception(exc)


class ConverterProcess:
    """Supervised child processes converting sealed spool segments (each claims one segment at a time)."""

    def __init__(self, data: Path, interval: float = 0.25, processes: int | None = None,
                 retention: float = DONE_RETENTION_SECONDS) -> None:
        self.data = Path(data)
        self.interval = interval
        self.retention = retention
        self.processes = processes or default_processes()
        self._procs: list[Child | None] = [None] * self.processes
        self._lock = threading.Lock()
        self._launcher: _Launcher | None = None
        self._closed = False

    def start(self) -> None:
        """Start the children that are not running (all of them on the first call)."""
        with self._lock:
            for w, proc in enumerate(self._procs):
                if proc is None or proc.poll() is not None:
                    self._procs[w] = self._spawn(w)

    def _spawn(self, w: int) -> Child:
        """Start child ``w`` (the caller holds the lock)."""
        if self._launcher is None:
            self._launcher = _Launcher()
        args = [str(self.data), repr(self.interval), str(os.getpid()), str(w), str(self.processes), repr(self.retention)]
        proc = self._launcher.popen([sys.executable, "-P", "-m", CHILD_MODULE, *args])
        logger.debug("converter process %d started (pid %d)", w, proc.pid)
        return proc

    def ensure_alive(self) -> None:
        """Restart a child that died unexpectedly."""
        with self._lock:
            for w, proc in enumerate(self._procs):
                if self._closed or proc is None or proc.poll() is None:
                    continue
                logger.error("converter process %d exited with %s; restarting it", w, proc.returncode)
                try:
                    self._procs[w] = self._spawn(w)
                except OSError as exc:
                    logger.error("cannot restart converter process %d (%s); retrying later", w, exc)

    def pids(self) -> list[int | None]:
        """Return the children's process ids (None where none was started)."""
        with self._lock:
            return [None if proc is None else proc.pid for proc in self._procs]

    def pending(self) -> int:
        """Return how many sealed segments wait for conversion."""
        return sum(1 for _ in spool_dir(self.data).glob(f"*{SEALED_SUFFIX}"))

    def flush(self, timeout: float = 120.0) -> bool:
        """Wait until every sealed segment is converted; return False on timeout."""
        deadline = time.monotonic() + timeout
        while self.pending():
            self.ensure_alive()
            if time.monotonic() > deadline:
                logger.warning("flush: %d segments still waiting for conversion", self.pending())
                return False
            time.sleep(0.05)
        return True

    def stop(self, timeout: float = 60.0) -> None:
        """Let the children convert what is left (their pipe closes), then end them."""
        with self._lock:
            self._closed = True
            procs = [proc for proc in self._procs if proc is not None]
        for proc in procs:
            _close_pipe(proc)
        deadline = time.monotonic() + timeout
        for proc in procs:
            _wait_or_kill(proc, max(0.0, deadline - time.monotonic()))
        if self._launcher is not None:
            self._launcher.close()
            self._launcher = None

    def metrics_text(self) -> str:
        """Return the children's last metrics snapshots (Prometheus text, samples summed), or ''."""
        texts = []
        for w in range(self.processes):
            try:
                texts.append(state_file(self.data, metrics_name(w)).read_text())
            except OSError:
                continue
        return merge_metrics(texts)


def _close_pipe(proc: Child) -> None:
    """Close the child's stdin: its stop signal."""
    try:
        if proc.stdin is not None:
            proc.stdin.close()
    except OSError as exc:
        logger.debug("closing converter pipe: %s", exc)


def _wait_or_kill(proc: Child, timeout: float) -> None:
    """Wait for the child to end; SIGKILL it after ``timeout`` seconds (it ignores SIGTERM)."""
    try:
        proc.wait(timeout)
        return
    except subprocess.TimeoutExpired:
        logger.warning("converter process %d did not finish in %.0f s; killing it", proc.pid, timeout)
    proc.kill()
    try:
        proc.wait(KILL_WAIT_SECONDS)
    except subprocess.TimeoutExpired:
        logger.error("converter process %d survived SIGKILL for %.0f s", proc.pid, KILL_WAIT_SECONDS)


def merge_metrics(texts: list[str]) -> str:
    """Merge Prometheus texts of the same metrics: comments once, equal samples summed."""
    if len(texts) <= 1:
        return texts[0] if texts else ""
    order: list[str] = []
    values: dict[str, float] = {}
    for text in texts:
        for line in text.splitlines():
            name, _, value = line.rpartition(" ")
            if line.startswith("#") or not name:
                if line not in values and line not in order:
                    order.append(line)
                continue
            if name not in values:
                order.append(name)
                values[name] = 0.0
            try:
                values[name] += float(value)
            except ValueError:
                continue
    return "".join(f"{k} {_num(values[k])}\n" if k in values else f"{k}\n" for k in order)


def _num(v: float) -> str:
    return str(int(v)) if v.is_integer() else repr(v)
