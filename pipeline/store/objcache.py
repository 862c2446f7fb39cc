"""A local read-through cache of an object store's published files, bounded in size, least recently used out.

Published files never change once written, so a copy on local disk answers every later read. An entry is
keyed by the object's path, its ETag and its size (from the store's listing): a store wiped and written
again at the same paths gives other ETags, so an old copy is never served for a new object. Entries are
written to a temporary file, checked (size; for a Parquet file its two ``PAR1`` magics; the MD5 when the
ETag is one) and renamed into place, so concurrent processes share one directory and never read a partial
copy; a copy found truncated or damaged is dropped and fetched again. A hit sets the entry's mtime, and
eviction removes the oldest mtimes first once the directory holds more than the bound.

``TRACEDAG_CACHE_DIR``: the directory (default ``$XDG_CACHE_HOME/tracedag/objects``, i.e.
``~/.cache/tracedag/objects``). ``TRACEDAG_CACHE_SIZE``: the bound in bytes, with an optional ``K``/``M``/
``G``/``T`` suffix (default ``4G``); ``0`` or ``off`` turns the cache off (every read goes to the store).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from tracedag.schemas.errors import TracedagError

logger = logging.getLogger(__name__)

CACHE_DIR = "TRACEDAG_CACHE_DIR"
CACHE_SIZE = "TRACEDAG_CACHE_SIZE"
DEFAULT_SIZE = 4 << 30
STALE_TMP_SECONDS = 3600.0
"""A temporary file this old is a download that died with its process: eviction removes it."""
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_MD5 = re.compile(r"^[0-9a-f]{32}$")
MAGIC = b"PAR1"


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


@dataclass(frozen=True)
class Entry:
    """What a cached object must be: its path in the store, ETag and size."""

    path: str
    etag: str
    size: int
    modified: Any = field(default=None, compare=False)  # the listing's LastModified (a datetime), not in the key

    @property
    def name(self) -> str:
        """The entry's file name: a hash of the key, the size, and the object's suffix."""
        digest = hashlib.sha256(f"{self.path}\0{self.etag}\0{self.size}".encode()).hexdigest()[:40]
        suffix = ".parquet" if self.path.endswith(".parquet") else ".obj"
        return f"{digest}-{self.size}{suffix}"


@dataclass
class Counters:
    """What this process's cache did (tests and the benchmark read them)."""

    hits: int = 0
    fills: int = 0
    refetched: int = 0
    evicted: int = 0


class ObjectCache:
    """One cache directory with a size bound, shared by every process that uses it."""

    def __init__(self, root: Path, limit: int) -> None:
        self.root = root
        self.limit = limit
        self.counters = Counters()

    def open(self, entry: Entry, fetch: Any) -> PositionalReader:
        """The cached copy of ``entry`` opened for reading; ``fetch(dest)`` downloads it on a miss."""
        found = self._open_valid(entry)
        if found is not None:
            self.counters.hits += 1
            return PositionalReader(found)
        local = self.fill(entry, fetch)
        return PositionalReader(open(local, "rb"))

    def fill(self, entry: Entry, fetch: Any) -> Path:
        """Download ``entry`` (``fetch(dest)``), check it and move it into place; evict past the bound."""
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / entry.name
        tmp = self.root / f".tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        try:
            fetch(str(tmp))
            _check_download(tmp, entry)
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
        self.counters.fills += 1
        self.evict(keep=final)
        return final

    def _open_valid(self, entry: Entry) -> IO[bytes] | None:
        """The entry's file, open, when it is there and whole; a damaged one is removed."""
        path = self.root / entry.name
        try:
            f = open(path, "rb")  # noqa: SIM115 - handed to the caller, who closes it
        except FileNotFoundError:
            return None
        if _whole(f, entry):
            _touch(path)
            return f
        f.close()
        logger.warning("cached copy of %s is damaged (size or Parquet magic): fetching it again", entry.path)
        path.unlink(missing_ok=True)
        self.counters.refetched += 1
        return None

    def evict(self, keep: Path | None = None) -> int:
        """Remove the least recently used entries until the directory holds at most ``limit`` bytes."""
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
        self.counters.evicted += removed
        return removed


class PositionalReader:
    """A read-only file whose position is per thread, read with ``pread``.

    DuckDB reads a registered filesystem's file from several threads at once, each as ``seek`` then
    ``read`` (two calls, the GIL released between them): on one shared position a thread would read at
    another's offset (a Parquet footer then fails to decode, "invalid TType").
    """

    def __init__(self, f: IO[bytes]) -> None:
        self._file = f
        self._fd = f.fileno()
        self.size = os.fstat(self._fd).st_size
        self._where = threading.local()

    @property
    def closed(self) -> bool:
        """Whether ``close`` was called."""
        return self._file.closed

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
        data = os.pread(self._fd, max(0, want), pos)
        self._where.pos = pos + len(data)
        return data

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def close(self) -> None:
        """Close the file."""
        self._file.close()

    def __enter__(self) -> PositionalReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _entries(root: Path) -> tuple[list[tuple[float, int, Path]], int]:
    """Every entry as (mtime, size, path) and their total size; stale temporary files are removed."""
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
        out.append((st.st_mtime, st.st_size, Path(item.path)))
    return out, sum(size for _, size, _ in out)


def _whole(f: IO[bytes], entry: Entry) -> bool:
    """Whether an open copy has the object's size and, for Parquet, its leading and trailing magic."""
    if os.fstat(f.fileno()).st_size != entry.size:
        return False
    if entry.path.endswith(".parquet") and entry.size >= 8:
        head = f.read(4)
        f.seek(-4, os.SEEK_END)
        tail = f.read(4)
        f.seek(0)
        return head == MAGIC and tail == MAGIC
    return True


def _check_download(tmp: Path, entry: Entry) -> None:
    """Raise ``OSError`` unless a download has the object's size (and MD5, when the ETag is one)."""
    size = tmp.stat().st_size
    if size != entry.size:
        raise OSError(f"{entry.path}: downloaded {size} bytes, the store lists {entry.size}")
    etag = entry.etag.strip('"').lower()
    if _MD5.match(etag):
        digest = hashlib.md5(usedforsecurity=False)
        with open(tmp, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        if digest.hexdigest() != etag:
            raise OSError(f"{entry.path}: the downloaded bytes do not match the store's ETag {entry.etag}")


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
