"""#29 serve items 7 and 10: a killed SQL worker leaves no spill directory; a crash is reported as a crash."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.serve.hostile_support import busiest_child, descendants, idle_children
from tests.serve.serve_support import Server, running_server

TIMEOUT = 4.0  # long enough for DuckDB to spill on a loaded machine (it spills 1 MB 0.25 s in on a quiet one), and for
# the crash test to find and kill its worker first (1 s in); the spilling query burns the CPU of the whole timeout
# A sort that spills (tens of MB, under the worker's 256 MB spill cap) under 64 MB of memory, then a long
# CPU-bound scan of its rows: whatever the machine's speed, the worker has spilled and is still running at
# its timeout (a sort of 200M rows filled the spill cap first on a fast machine: 422, not the timeout).
SPILLING = ("select sum(hash(a.i * b.k)) from (select i, random() r from range(6000000) t(i) order by r) a, "
            "range(100000) b(k)")


@pytest.fixture(scope="module")
def temp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("servetmp")


@pytest.fixture(scope="module")
def server(serve_store: Path, temp: Path) -> Iterator[Server]:
    os.environ["TMPDIR"] = str(temp)  # the server and its workers spill here
    try:
        with running_server(serve_store, "--sql-timeout", str(TIMEOUT), "--sql-memory-mb", "64") as s:
            yield s
    finally:
        del os.environ["TMPDIR"]


def _spill_dirs(temp: Path) -> list[Path]:
    return sorted(temp.glob("tracedag-sql-*"))


def test_the_spill_directory_of_a_worker_killed_at_its_timeout_is_removed(server: Server, temp: Path) -> None:
    seen: list[int] = []
    done = threading.Event()

    def watch() -> None:  # the worker spills into its directory before it is killed
        while not done.wait(0.05):
            seen.append(sum(f.stat().st_size for d in _spill_dirs(temp) for f in d.rglob("*") if f.is_file()))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        r = server.client(timeout=60).post("/api/sql", json={"sql": SPILLING})
    finally:
        done.set()
        watcher.join()
    assert r.status_code == 408, r.text
    assert max(seen) > 1 << 20, max(seen)
    assert _spill_dirs(temp) == []


def test_a_crashed_worker_is_reported_as_a_crash_not_as_memory(server: Server) -> None:
    c = server.client(timeout=60)
    c.post("/api/sql", json={"sql": "select 1"})
    # ready and waiting: one takes the query, new ones start after it (forked workers are the server's grandchildren)
    spares = idle_children(server.proc.pid, kin=descendants)
    result: dict[str, httpx.Response] = {}
    asking = threading.Thread(target=lambda: result.update(r=c.post(
        "/api/sql", json={"sql": "select count(*) from range(1000000000) a, range(1000) b"})))
    asking.start()
    time.sleep(1)
    os.kill(busiest_child(server.proc.pid, spares, kin=descendants), signal.SIGSEGV)  # the worker running the query
    asking.join(30)
    r = result["r"]
    assert r.status_code == 500, r.text
    error = r.json()["error"]
    assert "crashed" in error and "SIGSEGV" in error and "memory" not in error, error
    assert c.post("/api/sql", json={"sql": "select 42 as n"}).json()["rows"] == [{"n": 42}]
