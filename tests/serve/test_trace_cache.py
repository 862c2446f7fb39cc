"""Trace views and unknown ids against the server's result caches (#29 items 4 and 5).

Unknown ids are answered from a per-build id set (cheap, nothing cached or left in flight); the
caches are bounded in bytes, and single traces live apart from whole-store results."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from tests.serve.serve_support import Server, running_server
from tracedag.pipeline.serve import encode
from tracedag.pipeline.serve.cache import ResultCache, size_of
from tracedag.pipeline.serve.data import NotFound, Store


@pytest.fixture(scope="module")
def server(serve_store: Path) -> Iterator[Server]:
    with running_server(serve_store) as s:
        yield s


def test_200_unknown_ids_are_404_and_cheap_over_the_real_server(server: Server) -> None:
    c = server.client()
    known = c.get("/api/traces", params={"limit": 1}).json()["traces"][0]["trace_id"]
    assert c.get(f"/api/traces/{known}").status_code == 200  # the id set is read once, here
    t0 = time.monotonic()
    for _ in range(200):
        r = c.get(f"/api/traces/{uuid.uuid4().hex}")
        assert r.status_code == 404 and "not built" in r.json()["error"]
    # measured: ~0.3 s in all over loopback; before #29 each took about a CPU-second (200 s)
    assert time.monotonic() - t0 < 30


def test_unknown_ids_leave_nothing_behind(serve_store: Path) -> None:
    store = Store(serve_store)
    for _ in range(200):
        with pytest.raises(NotFound):
            store.trace_json(uuid.uuid4().hex)
    assert store.cache.in_flight() == 0 and store.trace_cache.in_flight() == 0
    assert len(store.trace_cache) == 0


def test_a_failed_computation_leaves_no_in_flight_entry_even_with_waiters() -> None:
    cache = ResultCache(1 << 20)
    started = threading.Event()
    errors: list[str] = []

    def failing() -> object:
        started.set()
        time.sleep(0.05)
        raise RuntimeError("boom")

    def call() -> None:
        try:
            cache.get("s", "k", failing)
        except RuntimeError as e:
            errors.append(str(e))

    threads = [threading.Thread(target=call) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert errors == ["boom"] * 8 and cache.in_flight() == 0 and len(cache) == 0
    assert cache.get("s", "k", lambda: "ok") == "ok" and cache.in_flight() == 0


def test_the_cache_is_bounded_in_bytes_lru_first_and_keeps_no_oversized_value() -> None:
    table = pa.table({"x": pa.array(range(1000), pa.int64())})  # 8000 bytes
    assert size_of(table) == 8000
    cache = ResultCache(20_000)
    for k in ("a", "b"):
        cache.get("s", k, lambda: table)
    cache.get("s", "a", lambda: table)  # "a" used last: "b" goes first
    cache.get("s", "c", lambda: table)
    assert cache.nbytes == 16_000 and cache.peek("s", "b") is None and cache.peek("s", "a") is not None
    big = pa.table({"x": pa.array(range(3000), pa.int64())})
    assert cache.get("s", "big", lambda: big) is big  # answered, not kept
    assert cache.peek("s", "big") is None and cache.nbytes == 16_000


def test_viewing_every_trace_never_evicts_the_whole_store_results(serve_store: Path) -> None:
    store = Store(serve_store, trace_cache_bytes=64 * 1024)
    store.warm()
    state = store.state()
    ids = sorted(store.trace_ids())
    assert len(ids) > 64  # more traces than the old cache had entries
    for tid in ids:
        doc = json.loads(store.trace_json(tid))
        assert doc["trace"]["trace_id"] == tid
    assert store.trace_cache.nbytes <= 64 * 1024 and len(store.trace_cache) < len(ids)  # traces were evicted
    for name in ("trace_summary", "propagation", "root_causes"):
        assert store.cache.peek(state, repr((name, [], None))) is not None, name  # ... the whole results were not
    assert store.trace_json(ids[0]) == encode.dumps(store.documents([ids[0]])[ids[0]])
