"""The conversation keys each ``traces`` file holds, kept per process: the traces of given conversations without a scan.

A trace's conversation key is ``coalesce(conversation_id, trace_id)`` (a trace without a conversation is its own).
Every trace whose latest build is in a conversation has a ``traces`` row with that key, so the files holding a row
with one of the keys asked hold every such trace. Each file's keys are read once, as 64-bit hashes (``store.hashes``:
a collision only reads a file more, whose rows of other conversations are filtered out), so a live store pass
(``score.live_waiting``) or a reader's freshness (``store.freshdelta``) reads only the files that hold one.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tracedag.pipeline.store.fileids import Stamp
from tracedag.pipeline.store.hashes import key_hashes, sorted_unique, within

_KEYS: dict[Stamp, np.ndarray] = {}
"""The sorted hashes of the conversation keys of each ``traces`` file."""
_LOCK = threading.Lock()


def members(files: Iterable[Stamp], keys: pa.Array) -> set[str]:
    """The trace ids of every row (any build) of the ``traces`` files ``files`` whose conversation key is one of
    ``keys``. The keys of files not among ``files`` are forgotten (files a collection replaced)."""
    if not len(keys):
        return set()
    now = frozenset(files)
    wanted = sorted_unique(key_hashes(keys))
    with _LOCK:
        for gone in set(_KEYS) - now:
            _KEYS.pop(gone, None)
    out: set[str] = set()
    for stamp in now:
        if not within(wanted, _file_keys(stamp)).any():
            continue
        t = pq.read_table(stamp[0], columns=["trace_id", "conversation_id"])
        key = pc.coalesce(t.column("conversation_id"), t.column("trace_id"))
        out.update(str(x) for x in pc.unique(t.column("trace_id").filter(pc.is_in(key, value_set=keys))).to_pylist())
    return out


def _file_keys(stamp: Stamp) -> np.ndarray:
    found = _KEYS.get(stamp)
    if found is None:
        t = pq.read_table(stamp[0], columns=["trace_id", "conversation_id"])
        found = sorted_unique(key_hashes(pc.unique(pc.coalesce(t.column("conversation_id"), t.column("trace_id")))))
        with _LOCK:
            _KEYS[stamp] = found
    return found
