"""Run ``POST /api/sql`` statements in killable child processes (``sqlworker``).

``SqlRunner(data, limits)`` keeps ``limits.concurrent`` spare workers started (imports done, waiting
on stdin), hands a ready one the request, and starts the next spare. Each worker runs under ``RLIMIT_AS`` (the OS memory
cap DuckDB's ``memory_limit`` is not) and is SIGKILLed at the wall-clock deadline, or earlier when
checking the SQL (sqlglot, in the worker: never on the server's event loop) outlasts
``limits.check_timeout``; a semaphore lets at most ``limits.concurrent`` run, the others wait up to
``limits.queue_seconds`` and are then refused (``Busy``). The worker encodes the answer and writes
it as it goes; it is read here in chunks and never past ``limits.max_bytes`` (``answer``). Each
worker spills into its own directory, ``tracedag-sql-<server pid>-*`` in the temporary directory,
removed when the worker ends however it ends, and at start for servers no longer running. A
worker that dies never takes the server with it.

Workers are forked by a fork-server (``forked``, ``forkserver``) that made their imports once (~0.5 s CPU a worker saved);
while it is not ready (still importing, or gone and being restarted) a worker starts as a new interpreter
(``python -m tracedag.pipeline.serve.sqlworker``), with the same limits, environment and protocol.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import resource
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

from tracedag.pipeline.serve.answer import TooLarge
from tracedag.pipeline.serve.forked import ENV, Forked, ForkFailed, ForkServer
from tracedag.pipeline.store.remote import remote_of
from tracedag.schemas.errors import QueryFailed

logger = logging.getLogger(__name__)


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
    max_bytes: int = 8 << 20  # bytes of one encoded answer
    check_timeout: float = 2.0  # seconds the guard may take to check the SQL


@dataclass(frozen=True)
class Answer:
    """An encoded answer (at most ``max_bytes``) and whether rows were left out."""

    body: bytes
    truncated: bool


AS_HEADROOM_MB = 1536
"""Address space the interpreter, DuckDB and Arrow reserve before the query allocates anything."""


class SqlTimeout(QueryFailed):  # type: ignore[misc,unused-ignore]
    """The worker ran past its deadline and was killed."""


class SqlResources(QueryFailed):  # type: ignore[misc,unused-ignore]
    """The worker ran out of memory (its OS cap or DuckDB's limit) or died."""


class Busy(QueryFailed):  # type: ignore[misc,unused-ignore]
    """Every worker slot stayed taken for the queue time."""


class SqlCrashed(QueryFailed):  # type: ignore[misc,unused-ignore]
    """The worker died of something other than memory (a signal, an uncaught error)."""


class TextTooLarge(QueryFailed):  # type: ignore[misc,unused-ignore]
    """The SQL text is longer than the guard takes (the worker's ``sqlguard.SqlTooLarge``; the server does not
    import the guard, whose sqlglot cost each start ~0.1 s CPU: only the worker parses SQL)."""


class CheckTimeout(QueryFailed):  # type: ignore[misc,unused-ignore]
    """Checking the SQL took longer than ``check_timeout`` (the worker was killed)."""


# The worker's lines on stderr (``sqlworker``), here so the server need not import the worker (its guard
# imports sqlglot).
READY = b"tracedag-sql: ready\n"
"""Written to stderr once the imports and views are done, before the request is read."""
CHECKING = b"tracedag-sql: checking\n"
"""Written to stderr when the guard starts on the SQL (the connection made again if the store changed,
its catalogue read): the parent's check deadline starts here."""
CHECKED = b"tracedag-sql: checked\n"
"""Written to stderr once the SQL passed the guard: the parent's check deadline ends here."""


SPILL_PREFIX = "tracedag-sql-"
READY_WAIT = 60.0
"""Seconds a worker may take to import and make its views (at the server's start, and for a request
that finds no ready spare); the query's own clock starts when it is ready."""
_MEMORY_SIGNS = ("memoryerror", "bad_alloc", "out of memory", "cannot allocate memory")


def sweep_spill_dirs(root: Path | None = None) -> list[Path]:
    """Remove the spill directories of servers no longer running (``tracedag-sql-<pid>-*``); return them."""
    root = Path(root or tempfile.gettempdir())
    removed = []
    for path in root.glob(SPILL_PREFIX + "*-*"):
        pid = path.name[len(SPILL_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and path.is_dir() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def _cap(megabytes: int) -> None:
    limit = megabytes * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


class Proc(Protocol):
    """A worker process: ``subprocess.Popen`` (a new interpreter) or ``forked.Forked``."""

    @property
    def pid(self) -> int: ...
    @property
    def stdin(self) -> IO[bytes] | None: ...
    @property
    def stdout(self) -> IO[bytes] | None: ...
    @property
    def stderr(self) -> IO[bytes] | None: ...
    @property
    def returncode(self) -> int | None: ...
    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def kill(self) -> None: ...


class SqlRunner:
    """Spare-worker pool for the SQL endpoint of one store."""

    def __init__(self, data: Path, limits: SqlLimits | None = None, fork: bool = True) -> None:
        """``fork``: fork the workers from a fork-server; False: each is a new interpreter."""
        self.data = Path(data).resolve()
        self.limits = limits or SqlLimits()
        self._slots = threading.BoundedSemaphore(self.limits.concurrent)
        self._lock = threading.Lock()
        self._spares: list[_Worker] = []
        self._fork = fork
        self._forks: ForkServer | None = None

    def _env(self) -> dict[str, str]:
        # the worker gets no secrets, but an object store's credentials when it reads one (user SQL still
        # reaches the store's views only: file and URL functions are refused before it runs)
        hidden = ("TRACEDAG_TOKEN",) if remote_of(self.data) is not None else ("AWS_", "TRACEDAG_TOKEN")
        env = {k: v for k, v in os.environ.items() if not k.startswith(hidden)}
        # glibc reserves 64 MB of address space per thread's malloc arena: with DuckDB's and Arrow's threads
        # a waiting worker held 1.5 GB of its RLIMIT_AS and a 30 MB batch failed to allocate (0.6 GB with 2)
        env.setdefault("MALLOC_ARENA_MAX", "2")
        for name, value in ENV.items():  # no thread before the fork-server forks (forked.ENV)
            env.setdefault(name, value)
        return env

    def _start(self) -> Proc:
        """A new worker (called with ``_lock`` held): forked when the fork-server is ready, else a new interpreter."""
        cap = self.limits.memory_mb + AS_HEADROOM_MB
        forked = self._forked(cap << 20)
        if forked is not None:
            return forked
        spawned: subprocess.Popen[bytes] = subprocess.Popen(
            [sys.executable, "-m", "tracedag.pipeline.serve.sqlworker", str(self.data)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            preexec_fn=lambda: _cap(cap), env=self._env(), cwd=str(self.data),
        )
        return spawned

    def _forked(self, cap_bytes: int) -> Forked | None:
        """A worker from the fork-server, or None when it is not ready. One that fails to fork is closed and a new
        one started (ready for a later worker; this one is a new interpreter)."""
        server = self._fork_server()
        if server is None or not server.ready():
            return None
        try:
            return server.fork(cap_bytes, self.data)
        except ForkFailed as e:
            logger.warning("the SQL fork-server failed (%s): starting it again", e)
            server.close(grace=0.0)
            self._forks = None
            self._fork_server()
            return None

    def _fork_server(self) -> ForkServer | None:
        """The fork-server, started if there is none; None if forking is off, or one never got ready (it said why
        on stderr: then every worker is a new interpreter)."""
        if self._forks is not None and self._forks.state == "refused":
            logger.warning("the SQL fork-server did not start: each SQL worker starts a new interpreter")
            self._forks.close()
            self._forks, self._fork = None, False
        if self._fork and self._forks is None:
            self._forks = ForkServer(self._env(), self.data)
        return self._forks

    def _take(self) -> _Worker:
        """A ready spare, else the oldest, else a new worker."""
        with self._lock:
            for worker in list(self._spares):
                if worker.proc.poll() is not None:
                    self._spares.remove(worker)
                    _reap(worker.proc)
                elif not worker.ready:
                    worker.wait_ready(0)
            ready = [w for w in self._spares if w.ready]
            taken = ready[-1] if ready else self._spares[0] if self._spares else _Worker(self._start())
            if taken in self._spares:
                self._spares.remove(taken)
        return taken

    def _fill(self) -> None:
        """Top the spares up to ``concurrent`` (once a taken one is committed to its query, or died)."""
        with self._lock:
            while len(self._spares) < self.limits.concurrent:
                self._spares.append(_Worker(self._start()))

    def _give_back(self, worker: _Worker) -> None:
        """A worker whose SQL the guard refused ran nothing: it waits for the next request (so a refusal
        starts no process)."""
        with self._lock:
            if len(self._spares) < self.limits.concurrent:
                self._spares.append(worker)
                return
        _reap(worker.proc, kill=True)

    def warm(self) -> None:
        """Start ``concurrent`` spare workers and wait (up to ``READY_WAIT`` s) until they are ready, so
        queries skip the interpreter start; remove the spill directories dead servers left behind."""
        for path in sweep_spill_dirs():
            logger.warning("removed the spill directory %s of a server no longer running", path)
        with self._lock:
            server = self._fork_server()
        if server is not None:  # its imports are the spares' (a new interpreter each if it never gets ready)
            server.ready(READY_WAIT)
        self._fill()
        with self._lock:
            spares = list(self._spares)
        until = time.monotonic() + READY_WAIT
        for spare in spares:
            spare.wait_ready(max(0.0, until - time.monotonic()))

    def close(self) -> None:
        with self._lock:
            spares, self._spares = self._spares, []
            server, self._forks, self._fork = self._forks, None, False
        for worker in spares:
            _reap(worker.proc, kill=True)
        if server is not None:
            server.close()

    def run(self, sql: str, fmt: str = "json", truncate: bool = False) -> Answer:
        """Run ``sql`` in a worker, its answer encoded as ``fmt``; raise ``SqlTimeout``, ``CheckTimeout``,
        ``TooLarge``, ``SqlResources``, ``SqlCrashed``, ``Busy`` or ``QueryFailed`` (``TextTooLarge``...).

        ``truncate``: past ``max_bytes``, answer the rows that fit (marked truncated) instead of ``TooLarge``.
        """
        if not self._slots.acquire(timeout=self.limits.queue_seconds):
            raise Busy("sql", f"{self.limits.concurrent} queries are running; try again later")
        try:
            spill = Path(tempfile.mkdtemp(prefix=f"{SPILL_PREFIX}{os.getpid()}-"))
            try:
                return self._run(sql, fmt, truncate, spill)
            finally:
                shutil.rmtree(spill, ignore_errors=True)
        finally:
            self._slots.release()

    def _run(self, sql: str, fmt: str, truncate: bool, spill: Path) -> Answer:
        lim = self.limits
        request = {"sql": sql, "format": fmt, "truncate": truncate, "max_rows": lim.max_rows,
                   "max_bytes": lim.max_bytes, "threads": lim.threads, "memory_mb": lim.memory_mb,
                   "temp_mb": lim.temp_mb, "spill": str(spill)}
        worker = self._take()
        reading = _Reading(worker, lim, on_checked=self._fill)
        try:
            _send(worker.proc, json.dumps(request).encode() + b"\n")
            out, err = reading.collect()
        except BaseException:
            _reap(worker.proc, kill=True)
            self._fill()
            raise
        status = _last_json(err)
        if reading.again:
            self._give_back(worker)
            return self._failure(0, status, err)
        _reap(worker.proc, grace=1.0)
        self._fill()
        if "rows" in status:
            return Answer(bytes(out), bool(status.get("truncated")))
        return self._failure(worker.proc.wait(), status, err)

    def _failure(self, code: int, status: dict[str, object], err: bytes) -> Answer:
        reason = str(status.get("error", ""))
        kind = {"SqlTooLarge": TextTooLarge, "TooLarge": TooLarge}.get(str(status.get("kind")), QueryFailed)
        if "error" in status and not status.get("memory") and kind is not QueryFailed:
            raise kind("sql", reason)
        text = err.decode(errors="replace").lower()
        if status.get("memory") or any(sign in text for sign in _MEMORY_SIGNS):
            raise SqlResources("sql", f"out of memory ({self.limits.memory_mb} MB): {reason or 'the worker died'}")
        if "error" in status:
            raise QueryFailed("sql", reason)
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        logger.error("SQL worker crashed (%s): %s", how, err.decode(errors="replace")[-2000:])
        raise SqlCrashed("sql", f"the query worker crashed ({how}); the server logged its output")


@dataclass
class _Worker:
    proc: Proc
    ready: bool = False  # its READY line was read: it waits for a request with imports and views done

    def wait_ready(self, seconds: float) -> None:
        """Read the worker's stderr until its READY line (at most ``seconds``; then it just is not ready yet)."""
        assert self.proc.stderr is not None
        seen, until = b"", time.monotonic() + seconds
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stderr, selectors.EVENT_READ)
            while not self.ready and sel.select(max(0.0, until - time.monotonic())):
                chunk = os.read(self.proc.stderr.fileno(), 4096)
                seen += chunk
                self.ready = READY in seen
                if not chunk:
                    return


def _send(proc: Proc, request: bytes) -> None:
    assert proc.stdin is not None
    try:
        proc.stdin.write(request)
        proc.stdin.flush()
    except BrokenPipeError:  # the worker died before reading: its exit status and stderr say why
        pass


def _reap(proc: Proc, kill: bool = False, grace: float = 0.0) -> None:
    """Wait for ``proc`` (``grace`` seconds, then it is killed; ``kill``: at once) and close its pipes."""
    if not kill and grace:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace)
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            with contextlib.suppress(BrokenPipeError):
                pipe.close()


def _last_json(err: bytes) -> dict[str, object]:
    lines = err.decode(errors="replace").strip().splitlines()
    try:
        doc = json.loads(lines[-1]) if lines else None
    except ValueError:
        doc = None
    return doc if isinstance(doc, dict) else {}


class _Reading:
    """Read one worker's stdout (at most ``max_bytes`` + slack) and stderr until both end, within deadlines.

    Deadlines count from the moment the worker is ready (a spare may still be importing when the
    request comes, on a loaded machine for seconds; it gets ``READY_WAIT``): the guard's check gets
    ``check_timeout`` from the worker's ``CHECKING`` line (after a reconnect the store's change asked
    for) to its ``CHECKED`` line, the check and the query together ``timeout``. A refusal by the guard ends the reading with the worker still running (``again``).
    """

    SLACK = 64 * 1024
    KEEP_ERR = 64 * 1024

    def __init__(self, worker: _Worker, limits: SqlLimits, on_checked: Callable[[], None]) -> None:
        self.worker, self.proc, self.limits, self.on_checked = worker, worker.proc, limits, on_checked
        self.t0 = time.monotonic()
        self.ready_at: float | None = self.t0 if worker.ready else None
        self.checking_at: float | None = None
        self.checked = self.again = False
        self.out, self.err = bytearray(), bytearray()

    def _deadline(self) -> float:
        if self.ready_at is None:
            return self.t0 + READY_WAIT
        end = self.ready_at + self.limits.timeout
        if self.checked or self.checking_at is None:
            return end
        return min(end, self.checking_at + self.limits.check_timeout)

    def collect(self) -> tuple[bytearray, bytes]:
        with selectors.DefaultSelector() as sel:
            assert self.proc.stdout is not None and self.proc.stderr is not None
            sel.register(self.proc.stdout, selectors.EVENT_READ, "out")
            sel.register(self.proc.stderr, selectors.EVENT_READ, "err")
            while sel.get_map() and not self._ended(sel):
                left = self._deadline() - time.monotonic()
                if left <= 0:
                    raise self._expired()
                for key, _ in sel.select(left):
                    chunk = os.read(key.fd, 1 << 16)
                    if not chunk:
                        sel.unregister(key.fileobj)
                    elif key.data == "out":
                        self._take_out(chunk)
                    else:
                        self._take_err(chunk)
        return self.out, bytes(self.err)

    def _ended(self, sel: selectors.BaseSelector) -> bool:
        """Refused (``again``), or the answer is whole: stdout closed and the last stderr line written."""
        if self.again:
            return True
        done = self.checked and self.err.endswith(b"\n") and bool(_last_json(bytes(self.err)))
        return done and self.proc.stdout not in [k.fileobj for k in sel.get_map().values()]

    def _take_out(self, chunk: bytes) -> None:
        self.out += chunk
        if len(self.out) > self.limits.max_bytes + self.SLACK:  # the worker bounds itself; this is the backstop
            raise TooLarge("sql", f"the answer is larger than {self.limits.max_bytes} bytes (--sql-max-bytes)")

    def _take_err(self, chunk: bytes) -> None:
        self.err += chunk
        if self.ready_at is None and READY in self.err:
            self.ready_at, self.worker.ready = time.monotonic(), True
        if self.checking_at is None and CHECKING in self.err:
            self.checking_at = time.monotonic()
        if not self.checked and CHECKED in self.err:
            self.checked = True
            self.on_checked()
        if not self.checked and self.err.endswith(b"\n") and _last_json(bytes(self.err)).get("again"):
            self.again = True
        if len(self.err) > self.KEEP_ERR:
            del self.err[:len(self.err) - self.KEEP_ERR]

    def _expired(self) -> QueryFailed:
        if self.ready_at is None:
            return Busy("sql", f"no query worker started within {READY_WAIT:g} s (the machine is overloaded)")
        if not self.checked and self.checking_at is not None:  # nothing ran: the statement is refused as slow to check
            if time.monotonic() >= self.checking_at + self.limits.check_timeout:
                return CheckTimeout("sql", f"checking the SQL took longer than {self.limits.check_timeout:g} s "
                                           "(--sql-check-timeout); send a shorter or simpler statement")
            return CheckTimeout("sql", f"checking the SQL did not end within the query's {self.limits.timeout:g} s "
                                       "(--sql-timeout); send a shorter or simpler statement")
        return SqlTimeout("sql", f"timed out after {self.limits.timeout:g} s (the query was killed)")
