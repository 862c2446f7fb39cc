"""E47: 50 concurrent clients sending large bodies: the excess gets 503, the receiver's memory stays
bounded by its in-flight budget, nothing crashes, and what was acknowledged is stored."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from tests.collector.collector_support import (
    make_request,
    make_span,
    post,
    rss_bytes,
    start_process,
    stop_process,
)
from tracedag.pipeline.store.views import connect

CLIENTS = 50
BODY_MIB = 4
INFLIGHT_MIB = 24


def _rss_mib(pid: int) -> float:
    return rss_bytes(pid) / 2**20


class Sampler:
    """Peak RSS of one process, sampled every 20 ms."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, _rss_mib(self.pid))

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak


def _big_body(i: int) -> bytes:
    span = make_span(i, name=f"big-{i}")
    kv = span.attributes.add()
    kv.key, kv.value.string_value = "gen_ai.input.messages", "x" * (BODY_MIB * 1024 * 1024)
    return make_request([span]).SerializeToString()


def test_e47_fifty_clients_of_large_bodies_get_503_and_memory_stays_bounded(tmp_path):
    proc, http_port, _ = start_process(tmp_path, "--max-inflight", f"{INFLIGHT_MIB}MiB", "--max-body", "8MiB",
                                       env={"TRACEDAG_CONVERTERS": "1"})
    try:
        time.sleep(0.5)
        idle = _rss_mib(proc.pid)
        bodies = [_big_body(i) for i in range(CLIENTS)]
        sampler = Sampler(proc.pid)
        with ThreadPoolExecutor(CLIENTS) as pool:
            statuses = list(pool.map(lambda b: post(http_port, b, timeout=60).status, bodies))
        peak = sampler.stop()
        assert set(statuses) <= {200, 503} and statuses.count(200) >= 1 and statuses.count(503) >= 1, statuses
        # bodies in flight are bounded by the budget: the receiver never holds anywhere near 50 x 4 MiB
        assert peak - idle < 4 * INFLIGHT_MIB, f"receiver grew {peak - idle:.0f} MiB (idle {idle:.0f} MiB)"
        assert proc.poll() is None, "the collector died"
        assert post(http_port, make_request([make_span(999)]).SerializeToString()).status == 200
        accepted = statuses.count(200) + 1
    finally:
        assert stop_process(proc) == 0
    names = connect(tmp_path).execute("select count(*) from spans").fetchall()
    assert names == [(accepted,)]  # every acknowledged span stored (SIGTERM drained and converted)
