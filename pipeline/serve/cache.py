"""The server's result cache: an LRU bounded in bytes, keyed by (build state, request).

``ResultCache(max_bytes)`` keeps values while their total size (``size_of``: Arrow ``nbytes``,
the length of encoded text) stays under ``max_bytes``; a value larger than the whole budget is
returned but not kept. Concurrent callers of one key wait for the first one's computation
(``get``), and a computation that raises leaves nothing behind: no value, no in-flight entry.
The server keeps two of them (``data.Store``): whole-store results and one for single traces, so
viewing many traces never evicts the results every page needs.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import pyarrow as pa

_Key = tuple[str, str]


def size_of(value: Any) -> int:
    """Bytes a cached value holds, near enough to budget by (Arrow buffers, text length, set members)."""
    if isinstance(value, (pa.Table, pa.RecordBatch, pa.Array, pa.ChunkedArray)):
        return int(value.nbytes)
    if isinstance(value, (bytes, bytearray, str)):
        return len(value)
    if isinstance(value, (set, frozenset)):
        return sum(64 + size_of(v) for v in value)
    return 256 + len(repr(value))


class ResultCache:
    """An LRU of results bounded in bytes, keyed by (build state, request)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[_Key, tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._flights: dict[_Key, threading.Lock] = {}

    @property
    def nbytes(self) -> int:
        """Bytes held now."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)

    def in_flight(self) -> int:
        """Computations under way (0 when idle: a failed one leaves no entry)."""
        with self._lock:
            return len(self._flights)

    def peek(self, state: str, key: str) -> Any:
        """The cached value, or None."""
        with self._lock:
            item = self._items.get((state, key))
        return None if item is None else item[0]

    def get(self, state: str, key: str, compute: Callable[[], Any]) -> Any:
        """The cached value, else ``compute()`` once: concurrent callers of one key wait for the first."""
        k = (state, key)
        with self._lock:
            if k in self._items:
                self._items.move_to_end(k)
                return self._items[k][0]
            flight = self._flights.setdefault(k, threading.Lock())
        try:
            with flight:
                with self._lock:
                    if k in self._items:
                        return self._items[k][0]
                value = compute()
                self._put(k, value)
                return value
        finally:
            with self._lock:
                if self._flights.get(k) is flight:
                    del self._flights[k]

    def _put(self, k: _Key, value: Any) -> None:
        size = size_of(value)
        if size > self.max_bytes:
            return
        with self._lock:
            if k in self._items:
                self._bytes -= self._items.pop(k)[1]
            self._items[k] = (value, size)
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, (_, old) = self._items.popitem(last=False)
                self._bytes -= old
