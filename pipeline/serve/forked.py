"""The server's side of the SQL workers' fork-server (``forkserver``): ``ForkServer`` and ``Forked``.

A worker started as a new interpreter spends most of its CPU importing DuckDB, Arrow and sqlglot. ``ForkServer``
starts the fork-server process (``python -m tracedag.pipeline.serve.forkserver``, in the workers' environment and
directory), which makes those imports once and forks each worker. For each worker the server makes four pipes and
sends the far ends over a socket (``SCM_RIGHTS``): the worker's stdin, stdout and stderr, and a status pipe on
which the worker's minder writes its pid, then its exit status as ``Popen.returncode`` has it (a signal as its
negative number). The minder keeps the dead worker unreaped until the server closes the status pipe, so a kill by
pid never reaches another process. ``Forked`` is that worker seen from the server, with the ``Popen`` methods
``sqlproc`` uses. A fork-server that is gone, or slow to fork, is noticed by ``fork`` (``ForkFailed``); ``sqlproc``
then starts the worker as a new interpreter and a new fork-server for the next ones.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

READY = b"ready"
"""The fork-server's message once its imports are done and it is single-threaded."""
FORK_WAIT = 10.0
"""Seconds a ready fork-server may take to fork a worker and send its pid."""
ENV = {"OPENBLAS_NUM_THREADS": "1", "JE_ARROW_MALLOC_CONF": "background_thread:false"}
"""Set (unless already set) where the workers run: importing pyarrow otherwise starts numpy's OpenBLAS thread and
Arrow's jemalloc background thread. The workers use neither (Arrow's pool is mimalloc)."""
MESSAGE_BYTES = 4096
"""The longest message on the socket, either way."""
SERVER = "tracedag.pipeline.serve.forkserver"


class ForkFailed(Exception):
    """The fork-server did not fork the worker (gone, refused, or slower than ``FORK_WAIT``)."""


class ForkServer:
    """One fork-server process for the workers of one store (``env`` and ``cwd`` are theirs)."""

    def __init__(self, env: Mapping[str, str], cwd: Path) -> None:
        self.sock, far = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", SERVER], stdin=far.fileno(), stdout=subprocess.DEVNULL,
                                         env=dict(env), cwd=str(cwd))
        except BaseException:
            self.sock.close()
            raise
        finally:
            far.close()
        self.state = "starting"
        self._asking = threading.Lock()  # one thread waits for its READY at a time

    def ready(self, seconds: float = 0.0) -> bool:
        """Whether it is ready to fork, waiting up to ``seconds`` for its ``READY``; ``state`` is then ``ready``, or
        ``refused`` when it ended or said something else before it (``starting`` while it imports, ``dead`` once a
        fork failed)."""
        if self.state == "starting" and self._asking.acquire(seconds > 0, seconds if seconds > 0 else -1):
            try:
                if self.state == "starting" and _readable(self.sock.fileno(), seconds):
                    self.state = "ready" if self._said() == READY else "refused"
            finally:
                self._asking.release()
        return self.state == "ready"

    def _said(self) -> bytes:
        try:
            return self.sock.recv(MESSAGE_BYTES)
        except OSError:
            return b""

    def fork(self, cap_bytes: int, data: Path) -> Forked:
        """A worker over the store ``data`` under ``RLIMIT_AS`` = ``cap_bytes``; raise ``ForkFailed``."""
        ours, theirs = _pipes()
        try:
            socket.send_fds(self.sock, [json.dumps({"cap": cap_bytes, "data": str(data)}).encode()], theirs)
        except OSError as e:
            close_all(ours)
            self.state = "dead"
            raise ForkFailed(f"the fork-server is gone ({e})") from e
        finally:
            close_all(theirs)
        try:
            pid, rest = _first_line(ours[3], FORK_WAIT)
        except ForkFailed:
            close_all(ours)
            self.state = "dead"
            raise
        return Forked(pid, ours[0], ours[1], ours[2], ours[3], said=rest)

    def close(self, grace: float = 2.0) -> None:
        """End it: its end of the socket closes, and after ``grace`` seconds it is killed (the workers it forked
        and their minders live on)."""
        self.sock.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(grace)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.state = "dead"


class Forked:
    """A forked worker: its pipes (``stdin``, ``stdout``, ``stderr``), ``pid``, and ``poll``, ``wait``, ``kill`` and
    ``returncode`` as ``subprocess.Popen`` has them (the exit status comes from its minder)."""

    def __init__(self, pid: int, stdin: int, stdout: int, stderr: int, status: int, said: bytes = b"") -> None:
        self.pid = pid
        self.stdin = open(stdin, "wb")  # noqa: SIM115 (closed by sqlproc's _reap, as Popen's pipes are)
        self.stdout = open(stdout, "rb", buffering=0)  # noqa: SIM115
        self.stderr = open(stderr, "rb", buffering=0)  # noqa: SIM115
        self._status: int | None = status
        self._said = said  # read from the status pipe after the pid line
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self._read(0.0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._read(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"sql worker {self.pid}", timeout or 0.0)
        return code

    def kill(self) -> None:
        if self.returncode is None:  # unreaped until its status is read: the pid is still this worker's
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def _read(self, timeout: float | None) -> int | None:
        """The exit status once the minder wrote it (``timeout`` seconds at most, None: until then)."""
        until = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None and self._status is not None:
            if not self._said.endswith(b"\n"):
                left = None if until is None else max(0.0, until - time.monotonic())
                if not _readable(self._status, left):
                    return None
                chunk = os.read(self._status, 64)
                self._said += chunk
                if chunk:
                    continue
            self._ended()
        return self.returncode

    def _ended(self) -> None:
        """Its status line came (or the pipe's end: the minder died, and the worker was killed with it). The status
        pipe is closed, so the minder reaps the worker and ends."""
        line = self._said.strip()
        self.returncode = int(line) if line.lstrip(b"-").isdigit() else -signal.SIGKILL
        assert self._status is not None
        os.close(self._status)
        self._status = None


def _pipes() -> tuple[list[int], list[int]]:
    """The server's ends (stdin to write, stdout, stderr, status to read) and the worker's (the other four)."""
    stdin, stdout, stderr, status = os.pipe(), os.pipe(), os.pipe(), os.pipe()
    return [stdin[1], stdout[0], stderr[0], status[0]], [stdin[0], stdout[1], stderr[1], status[1]]


def close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _readable(fd: int, seconds: float | None) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(None if seconds is None else int(seconds * 1000)))


def _first_line(fd: int, seconds: float) -> tuple[int, bytes]:
    """The worker's pid, the minder's first line, and what came after it; ``ForkFailed`` on anything else, the
    pipe's end, or a timeout."""
    said, until = b"", time.monotonic() + seconds
    while b"\n" not in said:
        if not _readable(fd, max(0.0, until - time.monotonic())):
            raise ForkFailed(f"the fork-server forked no worker within {seconds:g} s")
        chunk = os.read(fd, 64)
        if not chunk:
            raise ForkFailed("the fork-server ended before the worker started")
        said += chunk
    line, rest = said.split(b"\n", 1)
    if not line.isdigit():
        raise ForkFailed(f"the fork-server could not fork: {line.decode(errors='replace')}")
    return int(line), rest


