"""POST /api/sql against a real server: the hostile list of RELIABILITY.md section 4, runaway queries."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.serve.serve_support import Server, running_server
from tracedag.pipeline.serve import metrics
from tracedag.pipeline.serve.sqlguard import refuse
from tracedag.pipeline.store import freshness

TIMEOUT = 2.0


@pytest.fixture(scope="module")
def outside(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("outside")
    (d / "secret.csv").write_text("k\nTOP-SECRET-VALUE\n")
    return d


@pytest.fixture(scope="module")
def server(serve_store: Path, outside: Path) -> Iterator[Server]:
    link = serve_store / "link.csv"
    if not link.exists():
        link.symlink_to(outside / "secret.csv")
    with running_server(serve_store, "--sql-timeout", str(TIMEOUT), "--sql-memory-mb", "256",
                        "--sql-max-rows", "50") as s:
        yield s


# What the server itself keeps under the store's state/ while it runs (its warm-up and /metrics thread may write
# them at any moment): the build state's /metrics text and which traces the stored query rows answer.
SERVER_CACHES = (metrics.DISK, freshness.KEPT)


def _snapshot(*dirs: Path) -> set[tuple[str, int]]:
    out = set()
    for d in dirs:
        for root, _, files in os.walk(d):
            if Path(root).parent.name == "state" and Path(root).name in SERVER_CACHES:
                continue
            for f in files:
                p = os.path.join(root, f)
                out.add((p, os.lstat(p).st_mtime_ns))
    return out


def _hostile(store: Path, outside: Path) -> list[str]:
    return [
        # reads (test 59)
        "select * from read_text('/etc/passwd')",
        f"select * from read_csv('{outside}/secret.csv')",
        f"select * from read_json('{outside}/secret.csv')",
        f"select * from read_blob('{outside}/secret.csv')",
        f"select * from read_parquet('{outside}/x.parquet')",
        "select * from glob('/*')",
        "select * from parquet_metadata('/etc/passwd')",
        "from '/etc/passwd'",
        f"select * from '{outside}/secret.csv'",
        "select * from read_csv('~/x')",
        f"select * from read_csv('{store}/../outside/secret.csv')",
        f"select * from read_csv('{store}/link.csv')",
        "select * from read_csv('http://127.0.0.1:1/x.csv')",
        "select * from 's3://bucket/x.parquet'",
        "select * from sniff_csv('/etc/passwd')",
        "select * from query_table('spans')",
        "select getenv('HOME')",
        # writes and side effects (test 60)
        f"copy (select 1) to '{store}/evil.parquet'",
        f"copy spans to '{outside}/evil.csv'",
        f"export database '{outside}/evil'",
        f"attach '{outside}/evil.db' as e",
        "install httpfs",
        "load httpfs",
        "create temp table t as select 1",
        "create macro m() as 1",
        "create secret s (type s3, key_id 'a', secret 'b')",
        "set enable_external_access = true",
        "reset threads",
        "pragma version",
        "call pragma_version()",
        "checkpoint",
        "explain analyze select 1",
        "select * from duckdb_settings()",
        "select current_setting('home_directory')",
        # stacking (test 61)
        f"select 1; copy (select 1) to '{store}/evil.csv'",
        "select 1;;",
        # deep SQL (test 68)
        "select " + "(" * 50_000 + "1" + ")" * 50_000,
    ]


def test_every_hostile_statement_is_400_with_a_reason_and_touches_nothing(
        server: Server, serve_store: Path, outside: Path) -> None:
    before = _snapshot(serve_store, outside)
    cwd_before = set(os.listdir(serve_store))
    c = server.client()
    for sql in _hostile(serve_store, outside):
        r = c.post("/api/sql", content=sql)
        assert r.status_code == 400, (sql[:80], r.status_code, r.text[:200])
        reason = r.json()["error"]
        assert reason and "SECRET" not in r.text and "root:" not in r.text, (sql[:80], reason)
        assert refuse(sql) is not None  # refused by the parser, before any worker ran it
    assert _snapshot(serve_store, outside) == before
    assert set(os.listdir(serve_store)) == cwd_before


def test_a_semicolon_in_a_literal_and_the_json_body_are_fine(server: Server) -> None:
    c = server.client()
    assert c.post("/api/sql", content="select ';' as s").json()["rows"] == [{"s": ";"}]
    r = c.post("/api/sql", json={"sql": "with t as (select count(*) n from spans) select n > 0 as ok from t"})
    assert r.json() == {"columns": ["ok"], "rows": [{"ok": True}], "truncated": False}


def test_huge_sql_text_is_413(server: Server) -> None:
    r = server.client().post("/api/sql", content="select 1 " + " " * (1 << 20))
    assert r.status_code == 413 and "longer than" in r.json()["error"]


def test_huge_results_are_capped_and_marked(server: Server) -> None:
    t0 = time.monotonic()
    r = server.client().post("/api/sql", content="select * from range(10000000000)")
    assert r.status_code == 200 and time.monotonic() - t0 < TIMEOUT
    body = r.json()
    assert len(body["rows"]) == 50 and body["truncated"] is True


def test_a_cpu_runaway_is_killed_at_its_timeout_and_the_server_keeps_answering(server: Server) -> None:
    c = server.client()
    results: dict[str, object] = {}

    def runaway(key: str, sql: str) -> None:
        t0 = time.monotonic()
        r = c.post("/api/sql", content=sql)
        results[key] = (r.status_code, r.json()["error"], time.monotonic() - t0)

    threads = [threading.Thread(target=runaway, args=("cross", "select count(*) from range(1000000000) a, range(1000) b")),
               threading.Thread(target=runaway, args=("recursive", "with recursive r(n) as (select 1 union all "
                                                                   "select n + 1 from r) select count(*) from r"))]
    for t in threads:
        t.start()
    time.sleep(0.5)
    during = [c.get("/api/traces", params={"limit": 1}).status_code, c.get("/healthz").status_code]
    for t in threads:
        t.join(30)
    assert during == [200, 200]
    for key in ("cross", "recursive"):
        status, error, seconds = results[key]  # type: ignore[misc]
        assert status == 408 and "timed out" in error, (key, error)
        # the clock starts when a worker is ready: a second worker still starting on a loaded machine waits first
        assert TIMEOUT * 0.9 <= seconds <= TIMEOUT + 10, (key, seconds)
    assert c.post("/api/sql", content="select 42 as n").json()["rows"] == [{"n": 42}]


def test_a_memory_runaway_is_a_resource_error_and_the_server_keeps_answering(server: Server) -> None:
    c = server.client()
    t0 = time.monotonic()
    r = c.post("/api/sql", content="select length(repeat('x', 2000000000)) as n")
    assert r.status_code == 422 and "memory" in r.json()["error"], r.text
    assert time.monotonic() - t0 <= TIMEOUT + 10  # as above: a worker still starting is not counted
    assert c.post("/api/sql", content="select count(*) as n from spans").json()["rows"][0]["n"] > 0


def test_a_query_that_fails_in_duckdb_is_400_with_its_message(server: Server) -> None:
    r = server.client().post("/api/sql", content="select * from no_such_view")
    assert r.status_code == 400 and "no_such_view" in r.json()["error"]
