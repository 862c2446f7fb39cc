"""Run ``POST /api/sql`` statements in killable child processes (``sqlworker``).

``SqlRunner(data, limits)`` keeps one spare worker started (imports done, waiting on stdin), hands
it the request, and starts the next spare. Each worker runs under ``RLIMIT_AS`` (the OS memory
cap DuckDB's ``memory_limit`` is not) and is SIGKILLed at the wall-clock deadline; a semaphore
lets at most ``limits.concurrent`` run, the others wait up to ``limits.queue_seconds`` and are
then refused (``Busy``). A worker that dies never takes the server with it.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from tracedag.pipeline.store.remote import remote_of
from tracedag.schemas.errors import QueryFailed


@dataclass(frozen=True)
class SqlLimits:
    """Bounds of one ad-hoc query."""

    timeout: float = 10.0
    memory_mb: int = 1024  # DuckDB's memory_limit; the address-space cap is this plus AS_HEADROOM_MB
    max_rows: int = 10_000
    threads: int = 1
    temp_mb: int = 256
    concurrent: int = 2
    queue_seconds: float = 5.0


AS_HEADROOM_MB = 1536
"""Address space the interpreter, DuckDB and Arrow reserve before the query allocates anything."""


class SqlTimeout(QueryFailed):  # type: ignore[misc,unused-ignore]
    """The worker ran past its deadline and was killed."""


class SqlResources(QueryFailed):  # type: ignore[misc,unused-ignore]
    """The worker ran out of memory (its OS cap or DuckDB's limit) or died."""


class Busy(QueryFailed):  # type: ignore[misc,unused-ignore]
    """Every worker slot stayed taken for the queue time."""


def _cap(megabytes: int) -> None:
    limit = megabytes * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


class SqlRunner:
    """Spare-worker pool for the SQL endpoint of one store."""

    def __init__(self, data: Path, limits: SqlLimits | None = None) -> None:
        self.data = Path(data).resolve()
        self.limits = limits or SqlLimits()
        self._slots = threading.BoundedSemaphore(self.limits.concurrent)
        self._lock = threading.Lock()
        self._spare: subprocess.Popen[bytes] | None = None

    def _start(self) -> subprocess.Popen[bytes]:
        cap = self.limits.memory_mb + AS_HEADROOM_MB
        # the worker gets no secrets, but an object store's credentials when it reads one (user SQL still
        # reaches the store's views only: file and URL functions are refused before it runs)
        hidden = ("TRACEDAG_TOKEN",) if remote_of(self.data) is not None else ("AWS_", "TRACEDAG_TOKEN")
        env = {k: v for k, v in os.environ.items() if not k.startswith(hidden)}
        return subprocess.Popen(
            [sys.executable, "-m", "tracedag.pipeline.serve.sqlworker", str(self.data)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            preexec_fn=lambda: _cap(cap), env=env, cwd=str(self.data),
        )

    def _take(self) -> subprocess.Popen[bytes]:
        with self._lock:
            proc = self._spare if self._spare is not None and self._spare.poll() is None else self._start()
            self._spare = self._start()
        return proc

    def warm(self) -> None:
        """Start the spare worker now (the first query then skips the interpreter start)."""
        with self._lock:
            if self._spare is None:
                self._spare = self._start()

    def close(self) -> None:
        with self._lock:
            if self._spare is not None:
                self._spare.kill()
                self._spare.wait()
                self._spare = None

    def run(self, sql: str) -> pa.Table:
        """Run ``sql`` in a worker; raise ``SqlTimeout``, ``SqlResources``, ``Busy`` or ``QueryFailed``."""
        if not self._slots.acquire(timeout=self.limits.queue_seconds):
            raise Busy("sql", f"{self.limits.concurrent} queries are running; try again later")
        try:
            return self._run(sql)
        finally:
            self._slots.release()

    def _run(self, sql: str) -> pa.Table:
        lim = self.limits
        request = {"sql": sql, "max_rows": lim.max_rows, "threads": lim.threads,
                   "memory_mb": lim.memory_mb, "temp_mb": lim.temp_mb}
        proc = self._take()
        try:
            out, err = proc.communicate(json.dumps(request).encode(), timeout=lim.timeout)
        except subprocess.TimeoutExpired as e:
            proc.kill()
            proc.communicate()
            raise SqlTimeout("sql", f"timed out after {lim.timeout:g} s (the query was killed)") from e
        if proc.returncode == 0:
            return pa.ipc.open_stream(out).read_all()
        return self._failure(proc.returncode, err)

    def _failure(self, code: int, err: bytes) -> pa.Table:
        text = err.decode(errors="replace").strip()
        last = text.splitlines()[-1] if text else ""
        try:
            detail = json.loads(last)
        except ValueError:
            detail = None
        if isinstance(detail, dict) and "error" in detail:
            reason = str(detail["error"])
            if detail.get("memory") or "out of memory" in reason.lower() or "memory" in reason.lower() and "limit" in reason.lower():
                raise SqlResources("sql", f"out of memory ({self.limits.memory_mb} MB): {reason}")
            raise QueryFailed("sql", reason)
        raise SqlResources("sql", f"the query worker died (exit status {code}; memory cap "
                                  f"{self.limits.memory_mb + AS_HEADROOM_MB} MB address space)")
