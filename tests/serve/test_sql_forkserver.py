"""#31 #33: the SQL workers are forked by a fork-server (``forked``, ``forkserver``) that made their imports once.

Each test drives a real ``SqlRunner`` over the suite's store: a real fork-server, real workers, real pipes. The
statuses and messages are those of a worker started as a new interpreter (``fork=False``, run beside it), whatever
happens to the worker, its minder or the fork-server; nothing hangs and no descriptor or process is left behind.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.serve.hostile_support import children, descendants
from tracedag.pipeline.serve import forked
from tracedag.pipeline.serve.forked import Forked
from tracedag.pipeline.serve.sqlproc import (
    CheckTimeout,
    SqlCrashed,
    SqlLimits,
    SqlResources,
    SqlRunner,
    SqlTimeout,
)
from tracedag.schemas.errors import QueryFailed

LONG = "select count(*) from range(1000000000) a, range(1000) b"  # runs until it is killed
LIMITS = SqlLimits(timeout=4.0, memory_mb=64)


def _fds(pid: int) -> dict[int, str]:
    out = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out[int(fd)] = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile (listdir's own)
            continue
    return out


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


@pytest.fixture(scope="module")
def runner(serve_store: Path) -> Iterator[SqlRunner]:
    r = SqlRunner(serve_store, LIMITS)
    r.warm()
    try:
        yield r
    finally:
        r.close()


def _busy_worker(runner: SqlRunner, sql: str = LONG) -> tuple[threading.Thread, dict[str, object], int]:
    """Run ``sql`` in a thread; its answer (or error) lands in the dict; the pid of the worker running it."""
    spares = {w.proc.pid for w in runner._spares}
    result: dict[str, object] = {}

    def ask() -> None:
        try:
            result["answer"] = runner.run(sql)
        except QueryFailed as e:
            result["error"] = e

    asking = threading.Thread(target=ask)
    asking.start()
    assert _settles(lambda: not spares <= {w.proc.pid for w in runner._spares}, 30)  # one was taken
    (pid,) = spares - {w.proc.pid for w in runner._spares}
    time.sleep(0.3)  # it has its request
    return asking, result, pid


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_the_spares_are_forked_single_threaded_with_only_their_own_pipes(runner: SqlRunner) -> None:
    spares = [w.proc for w in runner._spares]
    assert len(spares) == LIMITS.concurrent and all(isinstance(p, Forked) for p in spares)
    assert runner._forks is not None
    server = runner._forks.proc.pid
    assert _threads(server) == 1  # nothing but the forking thread: a fork copies no lock another thread held
    assert sorted(_fds(server)) == [0, 1, 2]  # its socket, /dev/null, the server's stderr
    mine = set(_fds(os.getpid()).values())
    for proc in spares:
        fds = _fds(proc.pid)
        assert sorted(fds) == [0, 1, 2], fds  # its stdin, stdout, stderr: no other worker's pipe, no socket
        assert all(target in mine for target in fds.values())  # the server holds the other ends
        minder = _parent(proc.pid)
        assert minder in children(server) and sorted(_fds(minder))[-1] > 2  # the minder keeps its status pipe only
    answer = runner.run("select count(*) as n from traces")
    assert b'"n"' in answer.body and not answer.truncated


def test_requests_leave_no_descriptor_and_no_process_behind(serve_store: Path) -> None:
    before = set(_fds(os.getpid()))
    r = SqlRunner(serve_store, LIMITS)
    r.warm()
    assert r._forks is not None
    server = r._forks.proc.pid
    for i in range(6):
        assert f'"n": {i}'.encode() in r.run(f"select {i} as n").body
    with pytest.raises(QueryFailed):
        r.run("select * from read_text('/etc/passwd')")  # refused: the worker stays the spare
    assert sorted(_fds(server)) == [0, 1, 2]
    assert _settles(lambda: len(descendants(server)) == 2 * LIMITS.concurrent)  # the spares and their minders
    family = {server} | descendants(server)
    r.close()
    assert set(_fds(os.getpid())) <= before
    assert _settles(lambda: not any(Path(f"/proc/{pid}").exists() for pid in family))


def _settles(condition: Callable[[], bool], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize("fork", [True, False], ids=["forked", "new interpreter"])
def test_a_crash_a_kill_a_timeout_and_memory_give_the_same_status_and_message(serve_store: Path, fork: bool) -> None:
    # a timeout burns its seconds of CPU in the worker: 2 s here (4 s cost 8 s of the suite's CPU for the two ways);
    # the memory statement fails on its first 64 MB, long before it
    r = SqlRunner(serve_store, SqlLimits(timeout=2.0, memory_mb=64), fork=fork)
    r.warm()
    try:
        assert all(isinstance(w.proc, Forked) == fork for w in r._spares)
        for sig in (signal.SIGSEGV, signal.SIGKILL):
            asking, result, pid = _busy_worker(r)
            os.kill(pid, sig)
            asking.join(30)
            error = result["error"]
            assert isinstance(error, SqlCrashed) and f"signal {sig.name}" in error.reason, error
        with pytest.raises(SqlTimeout, match="timed out after 2 s"):
            r.run(LONG)
        with pytest.raises(SqlResources, match=r"out of memory \(64 MB\)"):
            r.run("select list(range) from range(100000000)")
        assert b'"n": 42' in r.run("select 42 as n").body
    finally:
        r.close()


def test_a_worker_whose_minder_dies_is_killed_with_it(runner: SqlRunner) -> None:
    asking, result, pid = _busy_worker(runner)
    minder = _parent(pid)
    os.kill(minder, signal.SIGKILL)
    asking.join(30)
    error = result["error"]
    assert isinstance(error, SqlCrashed) and "signal SIGKILL" in error.reason, error
    assert b'"n": 1' in runner.run("select 1 as n").body


def test_a_dead_fork_server_is_noticed_and_started_again(serve_store: Path) -> None:
    r = SqlRunner(serve_store, LIMITS)
    r.warm()
    try:
        assert r._forks is not None
        first = r._forks.proc
        first.kill()
        first.wait()
        t0 = time.monotonic()
        for i in range(3):  # the spares forked before it died answer; their replacements start as interpreters
            assert f'"n": {i}'.encode() in r.run(f"select {i} as n").body
        assert time.monotonic() - t0 < 60
        assert r._forks is not None and r._forks.proc is not first
        assert r._forks.ready(60)
        r.run("select 1")  # the spare started after it is the new fork-server's
        newest = r._spares[-1].proc
        assert isinstance(newest, Forked) and newest.pid in descendants(r._forks.proc.pid)
    finally:
        r.close()


def test_a_fork_server_that_stops_answering_is_replaced_not_waited_for(serve_store: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forked, "FORK_WAIT", 1.0)
    r = SqlRunner(serve_store, LIMITS)
    r.warm()
    try:
        assert r._forks is not None
        stopped = r._forks.proc
        os.kill(stopped.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        assert b'"n": 5' in r.run("select 5 as n").body
        assert time.monotonic() - t0 < 30  # one FORK_WAIT, then a new interpreter
        assert stopped.wait(10) == -signal.SIGKILL  # the stopped one was killed
        assert not isinstance(r._spares[-1].proc, Forked)  # its replacement was not ready: a new interpreter
    finally:
        r.close()


def test_a_fork_server_with_threads_refuses_and_every_worker_is_a_new_interpreter(
        serve_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JE_ARROW_MALLOC_CONF", "background_thread:true")  # Arrow's jemalloc starts its thread
    r = SqlRunner(serve_store, LIMITS)
    r.warm()
    try:
        assert r._forks is None and not any(isinstance(w.proc, Forked) for w in r._spares)
        assert b'"n": 3' in r.run("select 3 as n").body
    finally:
        r.close()


def test_a_statement_still_being_checked_at_the_query_s_deadline_is_refused_not_timed_out(serve_store: Path) -> None:
    r = SqlRunner(serve_store, SqlLimits(timeout=1.0, check_timeout=30.0))
    try:
        with pytest.raises(CheckTimeout, match="--sql-timeout"):  # 400: nothing ran (the deep-SQL test's 408 flake)
            r.run("select 1 where 1 in (" + ",".join(["1"] * 100_000) + ")")  # seconds to parse
    finally:
        r.close()
