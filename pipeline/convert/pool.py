"""Conversion spread over worker processes (one chunk of records per worker).

Workers are started once (``forkserver``, so no thread state of the parent is inherited) and
kept; each converts a chunk of serialized requests and sends back its Arrow table and key
arrays (pickled via Arrow IPC, no per-row Python objects cross the process boundary).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import threading
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pyarrow as pa

from tracedag.pipeline.convert.converted import Converted
from tracedag.pipeline.convert.records import convert_records

logger = logging.getLogger(__name__)

_POOL: ProcessPoolExecutor | None = None
_POOL_SIZE = 0
_LOCK = threading.Lock()


def _pool(workers: int) -> ProcessPoolExecutor:
    global _POOL, _POOL_SIZE
    with _LOCK:
        if _POOL is None or workers != _POOL_SIZE:
            if _POOL is not None:
                _POOL.shutdown()
            ctx = mp.get_context("forkserver")
            ctx.set_forkserver_preload(["tracedag.pipeline.convert.records"])
            _POOL, _POOL_SIZE = ProcessPoolExecutor(workers, mp_context=ctx), workers
        return _POOL


def shutdown() -> None:
    """Stop the worker processes (they are restarted on the next parallel conversion)."""
    global _POOL
    with _LOCK:
        if _POOL is not None:
            _POOL.shutdown()
            _POOL = None


def convert_parallel(records: list[tuple[bytes, int]], batch_id: str, workers: int) -> Converted:
    """Convert ``records`` in ``workers`` processes, one trace shard each (rows grouped by shard).

    Each worker parses every record (parsing is cheap) but converts and normalizes only the
    spans of its shard of traces, so traces are never split between workers. Rows are not put
    back in request order (the writer sorts by trace anyway); keys and hashes stay row-aligned.
    """
    pool = _pool(workers)
    shards = [(w, workers) for w in range(workers)]
    parts = list(pool.map(convert_records, [records] * workers, [batch_id] * workers, shards))
    return Converted(
        pa.concat_tables([p.table for p in parts]).unify_dictionaries(),
        np.concatenate([p.keys for p in parts]),
        np.concatenate([p.content for p in parts]),
        parts[0].bad_records,
    )
