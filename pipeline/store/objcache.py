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

``TRACEDAG_CACHE_DIR``: the directory (default ``$XDG_CACHE_HOME/tracedag/objects``, i.e.
``~/.cache/tracedag/objects``). ``TRACEDAG_CACHE_SIZE``: the bound in bytes, with an optional ``K``/``M``/
``G``/``T`` suffix (default ``4G``); ``0`` or ``off`` turns the cache off (every read goes to the store).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
from pathlib import Path

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
DEFAULT_SIZE = 4 << 30
STALE_TMP_SECONDS = 3600.0
"""A temporary file this old is one a dead process left: eviction removes it."""
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)


class CacheSettingError(TracedagError):  # type: ignore[misc,unused-ignore]
    """``TRACEDAG_CACHE_SIZE`` is not a size."""


def parse_size(text: str) -> int:
    """``"4G"`` → 4 GiB; ``"0"`` and ``"off"`` → 0 (no cache)."""
    if text.strip().lower() in ("off", "no", "false", "none"):
        return 0
    found = _SIZE.match(text)
    if found is None:
        raise CacheSettingError(f"{CACHE_SIZE}={text!r}: give a size such as 4G, 500M or 0 (off)")
    return int(float(found.group(1)) * _UNITS[found.group(2).lower()])


def default_dir() -> Path:
    """``$XDG_CACHE_HOME/tracedag/objects`` (``~/.cache/tracedag/objects``)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tracedag" / "objects"


class ObjectCache:
    """One cache directory with a size bound, shared by every process that uses it."""

    def __init__(self, root: Path, limit: int, block: int = BLOCK) -> None:
        self.root = root
        self.limit = limit
        self.block = block
        self.counters = Counters()
        self.claims = Claims()

    def open(self, entry: Entry, fetch: Fetch) -> BlockReader:
        """``entry`` opened for reading through its cached copy; ``fetch`` gets the blocks not held yet."""
        self.root.mkdir(parents=True, exist_ok=True)
        copy = EntryFile.open(self.root, entry, self.block, self.counters)
        copy.claims = self.claims
        _touch(copy.path)
        return BlockReader(copy, fetch, self)

    def evict(self, keep: Path | None = None) -> int:
        """Remove the least recently used entries until their allocated bytes are at most ``limit``."""
        entries, total = _entries(self.root)
        removed = 0
        for _mtime, size, path in sorted(entries):
            if total <= self.limit:
                break
            if path == keep:
                continue
            path.unlink(missing_ok=True)
            total -= size
            removed += 1
        self.counters.add(evicted=removed)
        return removed


class BlockReader:
    """A read-only file over an ``EntryFile``, its position per thread.

    DuckDB reads a registered filesystem's file from several threads at once, each as ``seek`` then
    ``read`` (two calls, the GIL released between them): on one shared position a thread would read at
    another's offset (a Parquet footer then fails to decode, "invalid TType").
    """

    def __init__(self, copy: EntryFile, fetch: Fetch, cache: ObjectCache) -> None:
        self._copy = copy
        self._fetch = fetch
        self._cache = cache
        self.size = copy.entry.size
        self._where = threading.local()

    @property
    def closed(self) -> bool:
        """Whether ``close`` was called."""
        return bool(self._copy.fd < 0)

    def _pos(self) -> int:
        return int(getattr(self._where, "pos", 0))

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        """Move this thread's position."""
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos(), os.SEEK_END: self.size}[whence]
        self._where.pos = max(0, base + offset)
        return int(self._where.pos)

    def tell(self) -> int:
        """This thread's position."""
        return self._pos()

    def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes (all that is left when negative) from this thread's position."""
        pos = self._pos()
        want = self.size - pos if n is None or n < 0 else n
        before = self._copy.counters.fills
        data: bytes = self._copy.read(pos, max(0, want), self._fetch)
        self._where.pos = pos + len(data)
        if self._copy.counters.fills != before:
            self._cache.evict(keep=self._copy.path)
        return data

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def close(self) -> None:
        """Close the file."""
        self._copy.close()

    def __enter__(self) -> BlockReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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


_CACHES: dict[tuple[Path, int], ObjectCache] = {}


def configured() -> ObjectCache | None:
    """The cache the environment asks for (one per directory and bound in a process), or None when off."""
    limit = parse_size(os.environ.get(CACHE_SIZE, str(DEFAULT_SIZE)))
    if limit <= 0:
        return None
    root = Path(os.environ.get(CACHE_DIR) or default_dir()).expanduser()
    return _CACHES.setdefault((root, limit), ObjectCache(root, limit))
