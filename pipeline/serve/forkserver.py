"""The fork-server of the SQL workers (``python -m tracedag.pipeline.serve.forkserver``; ``forked`` starts it).

It imports the worker's modules (``sqlworker``: DuckDB, Arrow, sqlglot) and loads the parser, checks it is
single-threaded (no DuckDB connection, no thread pool: a fork copies only the forking thread, and a lock another
thread held would stay held), says ``READY`` on its socket (fd 0), and waits. For each message (the worker's
address-space cap and store, with its four pipes) it forks a *minder*, which forks the worker: the worker takes the
pipes as its 0, 1 and 2, dies with its minder (``PR_SET_PDEATHSIG``), caps its address space (``RLIMIT_AS``) and
runs ``sqlworker.main`` as a new interpreter would. The minder writes the worker's pid and then its exit status on
the status pipe, and reaps the worker once the server closed that pipe. The fork-server ends when the server's end
of the socket closes.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import sys
from typing import Any

from tracedag.pipeline.serve.forked import MESSAGE_BYTES, READY, close_all

_LIBC: list[Any] = []  # the C library (ctypes), loaded by the fork-server for its workers' prctl


def serve() -> None:
    """The fork-server: import the worker, say ``READY`` on the socket (fd 0), fork a minder per message."""
    import ctypes
    import resource  # noqa: F401 (the workers' imports, made once here)
    import traceback  # noqa: F401

    from tracedag.pipeline.serve import sqlworker

    sqlworker.preload()
    _LIBC.append(ctypes.CDLL(None))
    # Ctrl-C or a SIGTERM to the process group ends the server, whose socket's end then ends this: the minders (which
    # inherit this) stay to reap their workers, whose CPU time so reaches the server's (the workers get the default)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, _reap_minders)
    sock = socket.socket(fileno=0)
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        sock.send(f"{threads} threads: not forking".encode())
        os._exit(2)
    sock.send(READY)
    while True:
        message, fds, _, _ = socket.recv_fds(sock, MESSAGE_BYTES, 4)
        if not message:  # the server's end closed: the minders end once the server's ends of their pipes are closed
            _wait_minders()
            os._exit(0)
        _fork_minder(json.loads(message), fds, sock)


def _wait_minders() -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    with contextlib.suppress(ChildProcessError):
        while True:
            os.waitpid(-1, 0)


def _reap_minders(signum: int, frame: Any) -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def _fork_minder(request: dict[str, Any], fds: list[int], sock: socket.socket) -> None:
    if len(fds) != 4:
        close_all(fds)
        return
    try:
        pid = os.fork()
    except OSError as e:
        _say(fds[3], f"fork: {e}")
        close_all(fds)
        return
    if pid == 0:
        try:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the minder waits for its worker itself
            sock.close()
            _mind(request, fds)
        finally:
            os._exit(70)
    close_all(fds)


def _mind(request: dict[str, Any], fds: list[int]) -> None:
    """Fork the worker, write its pid, then its exit status; reap it once the server closed the status pipe."""
    stdin, stdout, stderr, status = fds
    minder = os.getpid()
    try:
        pid = os.fork()
    except OSError as e:
        _say(status, f"fork: {e}")
        os._exit(1)
    if pid == 0:
        _work(request, fds, minder)
    close_all([stdin, stdout, stderr])
    _say(status, str(pid))
    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # dead, still unreaped
    assert info is not None  # None only with WNOHANG
    code = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
    _say(status, str(code))
    poller = select.poll()
    poller.register(status, 0)  # POLLERR once the server's end is closed
    poller.poll()
    os.waitpid(pid, 0)
    os._exit(0)


def _work(request: dict[str, Any], fds: list[int], minder: int) -> None:
    """The worker: its pipes as 0, 1, 2; killed when its minder dies; its address space capped; ``sqlworker``."""
    import resource

    code = 1
    try:
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)
        close_all(fds)
        _die_with(minder)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as a new interpreter has them
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        resource.setrlimit(resource.RLIMIT_AS, (int(request["cap"]), int(request["cap"])))
        code = _run_worker(str(request["data"]))
    finally:
        os._exit(code)


def _die_with(minder: int) -> None:
    pr_set_pdeathsig = 1
    _LIBC[0].prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != minder:  # it died before the prctl
        os._exit(1)


def _run_worker(data: str) -> int:
    """``sqlworker.main`` as ``python -m`` runs it: an uncaught error printed, exit status 1."""
    import traceback

    from tracedag.pipeline.serve import sqlworker

    try:
        code: int = sqlworker.main(["sqlworker", data])
        return code
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # as the interpreter would: the traceback on stderr
        traceback.print_exc()
        return 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()


def _say(fd: int, line: str) -> None:
    with contextlib.suppress(OSError):  # the server closed its end: nobody asks any more
        os.write(fd, line.encode() + b"\n")


if __name__ == "__main__":
    serve()
