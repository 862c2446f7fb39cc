"""Shared parts of the hostile-client tests (#29): a server's memory, its children, raw HTTP on a socket."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType


def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` (VmRSS of /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def children(pid: int) -> set[int]:
    """The processes whose parent is ``pid``."""
    out = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.add(int(entry))
    return out


def descendants(pid: int) -> set[int]:
    """The processes below ``pid``: its children, theirs, and so on (a forked SQL worker is the child of its minder,
    the fork-server's child)."""
    out: set[int] = set()
    todo = [pid]
    while todo:
        new = children(todo.pop()) - out
        out |= new
        todo.extend(new)
    return out


def stop_and_continue(pids: Callable[[], Iterable[int]], until: threading.Event, every: float = 0.002) -> None:
    """SIGSTOP then SIGCONT the processes ``pids()`` names every ``every`` seconds until ``until`` is set, as a
    sampling profiler (py-spy) or a shell's job control does; every process stopped is continued at the end."""
    seen: set[int] = set()
    while not until.is_set():
        now = set(pids())
        seen |= now
        for sig in (signal.SIGSTOP, signal.SIGCONT):
            for pid in now:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        time.sleep(every)
    for pid in seen:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def slow_read(stream, chunk: int = 1 << 16) -> bytes:  # type: ignore[no-untyped-def]
    """Read ``stream`` to its end a pipe-full at a time with pauses, so the writer fills the pipe and waits."""
    out = bytearray()
    while True:
        got = stream.read1(chunk) if hasattr(stream, "read1") else stream.read(chunk)
        if not got:
            return bytes(out)
        out += got
        time.sleep(0.0005)


def cpu_ticks(pid: int) -> int:
    """User plus system CPU time of ``pid`` in clock ticks (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])


def busiest_child(pid: int, among: set[int], seconds: float = 1.0,
                  kin: Callable[[int], set[int]] = children) -> int:
    """The child of ``pid`` (``kin``: or another of its relatives) in ``among`` that used the most CPU over ``seconds``."""
    before = {c: cpu_ticks(c) for c in kin(pid) & among}
    time.sleep(seconds)
    return max(before, key=lambda c: cpu_ticks(c) - before[c])


def idle_children(pid: int, timeout: float = 60, kin: Callable[[int], set[int]] = children) -> set[int]:
    """The children of ``pid`` (``kin``: or other relatives) once none of them used CPU for half a second (spares
    done starting)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = {c: cpu_ticks(c) for c in kin(pid)}
        time.sleep(0.5)
        if before and all(cpu_ticks(c) == ticks for c, ticks in before.items()):
            return set(before)
    raise AssertionError(f"the children of {pid} never went idle")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class PeakRss:
    """The highest value of ``measure(pid)`` (resident memory by default) seen every 20 ms in the block."""

    def __init__(self, pid: int, measure: Callable[[int], int] = rss_bytes) -> None:
        self.pid, self.measure = pid, measure
        self.peak = measure(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            try:
                self.peak = max(self.peak, self.measure(self.pid))
            except (OSError, AssertionError):
                return

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()


def raw_head(port: int, method: str, path: str, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def read_reply(sock: socket.socket, timeout: float) -> bytes:
    """What the server sends until it closes or ``timeout`` passes (b"" if nothing came)."""
    sock.settimeout(timeout)
    got = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except (TimeoutError, ConnectionResetError):
            break
        if not chunk:
            break
        got += chunk
        if b"\r\n\r\n" in got and b"content-length" in got.lower():
            head, _, body = got.partition(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            if len(body) >= length:
                break
    return got
