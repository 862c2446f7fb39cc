"""A local read-through cache of an object store's published files, bounded in size, least recently used out.

Published files never change once written, so bytes read once from the store answer every later read.
A query reads a few column chunks and the footers of a Parquet file, not all of it, so the cache keeps
**blocks** (``BLOCK`` bytes) of each object, fetched with ranged GETs as they are first read, in one
sparse file per object: a header (magic, object size, block size, one slot per block) then the object's
bytes at their offsets. A slot holds the block's CRC-32 once its bytes are written; a slot is written
only after its block, and every read checks the CRC of the blocks it returns, so a block a crash or a
full disk left half written, or a copy damaged later, is never served: it is fetched again. A miss
fetches only the blocks the read lacks, nothing ahead: DuckDB reads a Parquet file's footer, then the
chunks of the columns a query needs, every row group at once from several threads, so the reads are
already concurrent and a read-ahead fetches bytes no query reads (a scan of a few columns of a wide
spans file fetched all of it). Threads of a process never fetch the same block twice at once
(``cacheentry.Claims``).

An entry is keyed by the object's path, its ETag and its size (from the store's listing): a store wiped
and written again at the same paths gives other ETags, so an old copy is never served for a new object.
An entry file is created whole (header and size) under a temporary name and linked into place, so
concurrent processes share one file per object; two that fill the same block write the same bytes. A
read sets the entry's mtime, and eviction removes the oldest mtimes first once the entries' allocated
bytes pass the bound.

An object of at most ``TRACEDAG_CACHE_WHOLE`` bytes (default ``32M``; ``0``: none) is fetched whole on its
first read, in one GET, into a **complete copy** (``cachecopy``): a plain file of its bytes, which a
connection's views name in ``read_parquet`` instead of its URL, so DuckDB reads it natively (no Python call
per read); a block copy whose last missing block arrives becomes one too. A complete copy a connection
names is pinned (a shared ``flock``): eviction passes over it until the connection is gone.

``TRACEDAG_CACHE_DIR``: the directory (default ``$XDG_CACHE_HOME/tracedag/objects``, i.e.
``~/.cache/tracedag/objects``). ``TRACEDAG_CACHE_SIZE``: the bound in bytes, with an optional ``K``/``M``/
``G``/``T`` suffix (default ``4G``); ``0`` or ``off`` turns the cache off (every read goes to the store).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import os
import re
import threading
import time
import zlib
from pathlib import Path
from typing import Any

from tracedag.pipeline.store.cachecopy import SUFFIX as COPY_SUFFIX
from tracedag.pipeline.store.cachecopy import (
    CopyReader,
    Pins,
    ThreadFile,
    check_whole,
    open_copy,
    remove_unpinned,
    write_copy,
)
from tracedag.pipeline.store.cacheentry import (
    BLOCK,
    MAGIC,
    Claims,
    Counters,
    Entry,
    EntryFile,
    Fetch,
    inspect,
)
from tracedag.schemas.errors import TracedagError

__all__ = ["BLOCK", "MAGIC", "BlockReader", "CacheSettingError", "Counters", "Entry", "Fetch", "ObjectCache",
           "configured", "inspect", "parse_size"]

logger = logging.getLogger(__name__)

CACHE_DIR = "TRACEDAG_CACHE_DIR"
CACHE_SIZE = "TRACEDAG_CACHE_SIZE"
CACHE_WHOLE = "TRACEDAG_CACHE_WHOLE"
DEFAULT_SIZE = 4 << 30
DEFAULT_WHOLE = 32 << 20
"""Objects up to this size are fetched whole on their first read (one GET) into a complete copy."""
FETCH_LOCKS = 64
"""Whole fetches of objects whose names hash alike wait for each other (a lock per object would never go)."""
STALE_TMP_SECONDS = 3600.0
"""A temporary file this old is one a dead process left: eviction removes it."""
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)


class CacheSettingError(TracedagError):  # type: ignore[misc,unused-ignore]
    """``TRACEDAG_CACHE_SIZE`` is not a size."""


def parse_size(text: str, variable: str = CACHE_SIZE) -> int:
    """``"4G"`` → 4 GiB; ``"0"`` and ``"off"`` → 0 (no cache; for ``TRACEDAG_CACHE_WHOLE``: nothing whole)."""
    if text.strip().lower() in ("off", "no", "false", "none"):
        return 0
    found = _SIZE.match(text)
    if found is None:
        raise CacheSettingError(f"{variable}={text!r}: give a size such as 4G, 500M or 0 (off)")
    return int(float(found.group(1)) * _UNITS[found.group(2).lower()])


def default_dir() -> Path:
    """``$XDG_CACHE_HOME/tracedag/objects`` (``~/.cache/tracedag/objects``)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tracedag" / "objects"


class ObjectCache:
    """One cache directory with a size bound, shared by every process that uses it."""

    def __init__(self, root: Path, limit: int, block: int = BLOCK, whole: int = DEFAULT_WHOLE) -> None:
        self.root = root
        self.limit = limit
        self.block = block
        self.whole = whole
        self.counters = Counters()
        self.claims = Claims()
        self.pins = Pins()
        self._fetching = [threading.Lock() for _ in range(FETCH_LOCKS)]
        self._queued: set[str] = set()
        self._waiting: list[tuple[int, int, Entry, Fetch]] = []  # a heap: (0 first, 1 others), order queued
        self._order = itertools.count()
        self._lock = threading.Lock()

    def open(self, entry: Entry, fetch: Fetch) -> BlockReader | CopyReader:
        """``entry`` opened for reading through its cached copy; ``fetch`` gets the bytes not held yet: the
        whole object when it is at most ``whole`` bytes, else the blocks a read lacks."""
        self.root.mkdir(parents=True, exist_ok=True)
        fd = self.complete(entry)
        if fd is None and entry.size <= self.whole:
            fd = self._fetch_whole(entry, fetch)
        if fd is not None:
            return CopyReader(fd, entry.size)
        copy = EntryFile.open(self.root, entry, self.block, self.counters)
        copy.claims = self.claims
        _touch(copy.path)
        return BlockReader(copy, fetch, self)

    def complete(self, entry: Entry) -> int | None:
        """A descriptor of ``entry``'s complete copy (marked used now), or None when there is none."""
        path = self.root / entry.copy_name
        fd: int | None = open_copy(path, entry.size)
        if fd is not None:
            _touch(path)
            self.counters.add(copy_opens=1)
        return fd

    def pin(self, entry: Entry) -> Path | None:
        """The path of ``entry``'s complete copy, pinned against eviction (``pins.release`` unpins it), or None."""
        path: Path = self.root / entry.copy_name
        if not self.pins.pin(path, entry.size):
            return None
        _touch(path)
        return path

    def _fetch_whole(self, entry: Entry, fetch: Fetch) -> int | None:
        """Fetch ``entry`` in one GET into its complete copy (one thread of the process at a time)."""
        with self._fetching[zlib.crc32(entry.copy_name.encode()) % FETCH_LOCKS]:
            found = self.complete(entry)
            if found is not None:
                return found
            data = fetch(0, entry.size)
            check_whole(data, entry.size, entry.path)
            self.counters.add(fills=1, fetched_bytes=len(data), whole=1)
            return self._store_copy(entry, data)

    def fetch(self, entry: Entry, fetch: Fetch) -> bool:
        """Fetch ``entry`` whole into its complete copy now, unless it has one; False when it is too big for one."""
        if entry.size > self.whole:
            return False
        self.root.mkdir(parents=True, exist_ok=True)
        fd = self._fetch_whole(entry, fetch)
        if fd is not None:
            os.close(fd)
        return fd is not None

    def prefetch(self, entry: Entry, fetch: Fetch, first: bool = False) -> None:
        """Fetch ``entry`` whole in the background, unless it is too big or held: a view's files, queued when the
        view is made (DuckDB then opens each, the first one to bind the view, the others as a scan reaches them;
        meanwhile their GETs are under way). ``first``: fetched before every file queued without it (the files
        binding opens come before the rest of the views' files)."""
        if entry.size > self.whole or (self.root / entry.copy_name).exists():
            return
        with self._lock:
            if entry.copy_name in self._queued:
                return
            self._queued.add(entry.copy_name)
            heapq.heappush(self._waiting, (0 if first else 1, next(self._order), entry, fetch))
        _prefetcher().submit(self._prefetch_next)

    def _prefetch_next(self) -> None:
        """Fetch the queued object that comes first (one task is submitted per object queued)."""
        with self._lock:
            _, _, entry, fetch = heapq.heappop(self._waiting)
        self._prefetch_one(entry, fetch)

    def _prefetch_one(self, entry: Entry, fetch: Fetch) -> None:
        try:
            # queued before the read that triggered it reached ``open``: the cache directory may not exist yet
            self.root.mkdir(parents=True, exist_ok=True)
            fd = self._fetch_whole(entry, fetch)
            if fd is not None:
                os.close(fd)
            self.counters.add(prefetched=1)
        except Exception:  # the read that needs it fetches it then, and says why it cannot
            logger.warning("prefetching %s failed", entry.path, exc_info=True)
        finally:
            with self._lock:
                self._queued.discard(entry.copy_name)

    def _store_copy(self, entry: Entry, data: bytes) -> int | None:
        """Write ``data`` (checked) as ``entry``'s complete copy, drop its block copy, evict; its descriptor."""
        path = self.root / entry.copy_name
        write_copy(path, data)
        (self.root / entry.name).unlink(missing_ok=True)
        self.evict(keep=path)
        fd: int | None = open_copy(path, entry.size)
        return fd

    def completed(self, copy: EntryFile) -> None:
        """Make a block copy whose every block is now held (each CRC checked) a complete copy."""
        data = copy.whole()
        if data is not None:
            fd = self._store_copy(copy.entry, data)
            if fd is not None:
                os.close(fd)

    def evict(self, keep: Path | None = None) -> int:
        """Remove the least recently used entries until their allocated bytes are at most ``limit``."""
        entries, total = _entries(self.root)
        removed = 0
        for _mtime, size, path in sorted(entries):
            if total <= self.limit:
                break
            if path == keep:
                continue
            if path.suffix == COPY_SUFFIX:
                if not remove_unpinned(path):  # a connection reads it natively: kept until it is gone
                    continue
            else:
                path.unlink(missing_ok=True)
            total -= size
            removed += 1
        self.counters.add(evicted=removed)
        return removed


class BlockReader(ThreadFile):  # type: ignore[misc,unused-ignore]
    """A read-only file over an ``EntryFile``, its position per thread (``ThreadFile``)."""

    def __init__(self, copy: EntryFile, fetch: Fetch, cache: ObjectCache) -> None:
        super().__init__(copy.entry.size)
        self._copy = copy
        self._fetch = fetch
        self._cache = cache

    @property
    def closed(self) -> bool:
        """Whether ``close`` was called."""
        return bool(self._copy.fd < 0)

    def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes (all that is left when negative) from this thread's position."""
        pos = self.tell()
        want = self.size - pos if n is None or n < 0 else n
        before = self._copy.counters.fills
        data: bytes = self._copy.read(pos, max(0, want), self._fetch)
        self._where.pos = pos + len(data)
        if self._copy.counters.fills != before:
            self._cache.evict(keep=self._copy.path)
            if all(self._copy.slots(0, self._copy.blocks - 1)):
                self._cache.completed(self._copy)
        return data

    def close(self) -> None:
        """Close the file."""
        self._copy.close()


def _entries(root: Path) -> tuple[list[tuple[float, int, Path]], int]:
    """Every entry as (mtime, allocated bytes, path) and their total; stale temporary files are removed."""
    out: list[tuple[float, int, Path]] = []
    now = time.time()
    try:
        scan = list(os.scandir(root))
    except FileNotFoundError:
        return [], 0
    for item in scan:
        try:
            st = item.stat()
        except FileNotFoundError:  # evicted by another process meanwhile
            continue
        if item.name.startswith(".tmp-"):
            if now - st.st_mtime > STALE_TMP_SECONDS:
                Path(item.path).unlink(missing_ok=True)
            continue
        out.append((st.st_mtime, st.st_blocks * 512, Path(item.path)))
    return out, sum(size for _, size, _ in out)


def _touch(path: Path) -> None:
    """Mark an entry used now (mtime: atime is not updated on noatime/relatime mounts)."""
    with contextlib.suppress(OSError):  # evicted meanwhile (the open file stays readable), or read-only
        os.utime(path)


PREFETCHERS = 4
"""Background whole fetches one process makes at once (``ObjectCache.prefetch``)."""
_PREFETCH: list[Any] = []


def _prefetcher() -> Any:
    """The process's prefetch threads (made on first use)."""
    with _PREFETCH_LOCK:
        if not _PREFETCH:
            from concurrent.futures import ThreadPoolExecutor

            _PREFETCH.append(ThreadPoolExecutor(PREFETCHERS, thread_name_prefix="tracedag-prefetch"))
        return _PREFETCH[0]


_PREFETCH_LOCK = threading.Lock()
_CACHES: dict[tuple[Path, int, int], ObjectCache] = {}


def configured() -> ObjectCache | None:
    """The cache the environment asks for (one per directory and bound in a process), or None when off."""
    limit = parse_size(os.environ.get(CACHE_SIZE, str(DEFAULT_SIZE)))
    if limit <= 0:
        return None
    whole = parse_size(os.environ.get(CACHE_WHOLE, str(DEFAULT_WHOLE)), CACHE_WHOLE)
    root = Path(os.environ.get(CACHE_DIR) or default_dir()).expanduser()
    return _CACHES.setdefault((root, limit, whole), ObjectCache(root, limit, whole=whole))
