"""A local read-through cache of an object store's published files, bounded in size, least recently used out.

Published files never change once written, so bytes read once from the store answer every later read.
A query reads a few column chunks and the footers of a Parquet file, not all of it, so the cache keeps
**blocks** (``BLOCK`` bytes) of each object, fetched with ranged GETs as they are first read, in one
sparse file per object: a header (magic, object size, block size, one slot per block) then the object's
bytes at their offsets. A slot holds the block's CRC-32 once its bytes are written; a slot is written
only after its block, and every read checks the CRC of the blocks it returns, so a block a crash or a
full disk left half written, or a copy damaged later, is never served: it is fetched again.

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
import hashlib
import logging
import os
import re
import struct
import threading
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracedag.schemas.errors import TracedagError

logger = logging.getLogger(__name__)

CACHE_DIR = "TRACEDAG_CACHE_DIR"
CACHE_SIZE = "TRACEDAG_CACHE_SIZE"
DEFAULT_SIZE = 4 << 30
BLOCK = 128 << 10
"""Bytes per cached block: a Parquet column chunk of a small row group is 16-80 kB, a footer 20-50 kB."""
MAX_GET = 8 << 20
"""At most this many bytes per ranged GET: a longer run of missing blocks is fetched as several, at once."""
STALE_TMP_SECONDS = 3600.0
"""A temporary file this old is one a dead process left: eviction removes it."""
MAGIC = b"TDOC\x01\x00\x00\x00"
_HEAD = struct.Struct("<8sQQ")  # magic, object size, block size; then one <Q slot per block
_PRESENT = 1 << 32  # a slot is _PRESENT | crc32 once its block is written; 0 before
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)

Fetch = Callable[[int, int], bytes]
"""``fetch(start, end)``: the object's bytes ``[start, end)`` from the store."""


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
        """The entry's file name: a hash of the key, and the size."""
        digest = hashlib.sha256(f"{self.path}\0{self.etag}\0{self.size}".encode()).hexdigest()[:40]
        return f"{digest}-{self.size}.blk"


@dataclass
class Counters:
    """What this process's cache did (tests and the benchmark read them)."""

    hits: int = 0  # reads answered from the copy alone
    fills: int = 0  # ranged GETs made
    fetched_bytes: int = 0
    refetched: int = 0  # blocks found damaged and fetched again
    evicted: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        """Add to counters (DuckDB reads from several threads)."""
        with self.lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)


class ObjectCache:
    """One cache directory with a size bound, shared by every process that uses it."""

    def __init__(self, root: Path, limit: int, block: int = BLOCK) -> None:
        self.root = root
        self.limit = limit
        self.block = block
        self.counters = Counters()

    def open(self, entry: Entry, fetch: Fetch) -> BlockReader:
        """``entry`` opened for reading through its cached copy; ``fetch`` gets the blocks not held yet."""
        self.root.mkdir(parents=True, exist_ok=True)
        copy = EntryFile.open(self.root, entry, self.block, self.counters)
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


class EntryFile:
    """One object's sparse copy, open read-write: header, block slots, then the object's bytes."""

    def __init__(self, fd: int, path: Path, entry: Entry, block: int, counters: Counters) -> None:
        self.fd, self.path, self.entry, self.block, self.counters = fd, path, entry, block, counters
        self.blocks = max(1, -(-entry.size // block))
        self.data_at = _header_size(self.blocks)

    @classmethod
    def open(cls, root: Path, entry: Entry, block: int, counters: Counters, create: bool = True) -> EntryFile:
        """The entry's file, made (whole, then linked into place) when missing; a damaged one is made again."""
        path = root / entry.name
        for _ in range(5):  # evicted or replaced by another process between the calls: again
            try:
                fd = os.open(path, os.O_RDWR)
            except FileNotFoundError:
                if not create:
                    raise
                _create(path, entry, block)
                continue
            found = cls(fd, path, entry, block, counters)
            if found.valid():
                return found
            found.close()
            logger.warning("cached copy of %s has a damaged header or size: making it again", entry.path)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        raise OSError(f"{path}: the cache entry of {entry.path} keeps changing under this process")

    def valid(self) -> bool:
        """Whether the file's header and length are those of this entry (a truncated file is not)."""
        head = os.pread(self.fd, _HEAD.size, 0)
        if len(head) != _HEAD.size or _HEAD.unpack(head) != (MAGIC, self.entry.size, self.block):
            return False
        return os.fstat(self.fd).st_size == self.data_at + self.entry.size

    def slots(self, first: int, last: int) -> list[int]:
        """The slots of blocks ``first`` .. ``last``."""
        raw = os.pread(self.fd, 8 * (last - first + 1), _HEAD.size + 8 * first)
        return list(struct.unpack(f"<{last - first + 1}Q", raw))

    def held(self) -> tuple[int, int]:
        """(bytes of the object in blocks whose CRC matches, blocks marked present whose CRC does not)."""
        slots = self.slots(0, self.blocks - 1)
        good = bad = 0
        for b, data in self._blocks(0, self.blocks - 1):
            if _crc_ok(data, slots[b]):
                good += len(data)
            elif slots[b]:
                bad += 1
        return good, bad

    def _blocks(self, first: int, last: int) -> list[tuple[int, bytes]]:
        start = first * self.block
        raw = os.pread(self.fd, min(self.entry.size, (last + 1) * self.block) - start, self.data_at + start)
        return [(b, raw[(b - first) * self.block:(b - first + 1) * self.block]) for b in range(first, last + 1)]

    def read(self, pos: int, n: int, fetch: Fetch) -> bytes:
        """The object's bytes ``[pos, pos + n)``: held blocks checked, missing or damaged ones fetched."""
        end = min(pos + n, self.entry.size)
        if pos >= end:
            return b""
        first, last = pos // self.block, (end - 1) // self.block
        fetched = False
        for attempt in range(2):
            slots = self.slots(first, last)
            missing = [first + i for i, slot in enumerate(slots) if not slot]
            if missing:
                self.fill(missing, fetch)
                fetched = True
                slots = self.slots(first, last)
            blocks = self._blocks(first, last)
            bad = [b for b, data in blocks if not _crc_ok(data, slots[b - first])]
            if not bad:
                if not fetched:
                    self.counters.add(hits=1)
                raw = b"".join(data for _, data in blocks)
                return raw[pos - first * self.block:end - first * self.block]
            self._drop(bad, attempt)
        raise OSError(f"{self.path}: blocks {bad} of {self.entry.path} do not match their checksums after a refetch")

    def _drop(self, bad: list[int], attempt: int) -> None:
        """Clear the slots of blocks whose bytes do not match (fetched again by the caller)."""
        logger.warning("cached copy of %s: %d damaged block(s) (checksum): fetching them again",
                       self.entry.path, len(bad))
        self.counters.add(refetched=len(bad))
        for b in bad:
            os.pwrite(self.fd, bytes(8), _HEAD.size + 8 * b)

    def fill(self, blocks: list[int], fetch: Fetch) -> None:
        """Fetch ``blocks`` (runs of adjacent ones in one ranged GET each, several at once) and store them."""
        runs = _runs(blocks, max(1, MAX_GET // self.block))
        if len(runs) == 1:
            self._fill_run(runs[0], fetch)
            return
        for future in [_pool().submit(self._fill_run, run, fetch) for run in runs]:
            future.result()

    def _fill_run(self, run: tuple[int, int], fetch: Fetch) -> None:
        first, last = run
        start, end = first * self.block, min(self.entry.size, (last + 1) * self.block)
        data = fetch(start, end)
        if len(data) != end - start:
            raise OSError(f"{self.entry.path}: asked bytes {start}-{end - 1}, the store sent {len(data)} bytes")
        os.pwrite(self.fd, data, self.data_at + start)  # the bytes first, then their slots
        slots = [_PRESENT | zlib.crc32(data[(b - first) * self.block:(b - first + 1) * self.block])
                 for b in range(first, last + 1)]
        os.pwrite(self.fd, struct.pack(f"<{len(slots)}Q", *slots), _HEAD.size + 8 * first)
        self.counters.add(fills=1, fetched_bytes=len(data))

    def close(self) -> None:
        """Close the file."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> EntryFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
        return self._copy.fd < 0

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
        data = self._copy.read(pos, max(0, want), self._fetch)
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


def inspect(path: Path) -> tuple[int, int]:
    """An entry file's (bytes held whole, damaged blocks): what a test or ``du`` of the cache cannot tell."""
    with open(path, "rb") as f:
        magic, size, block = _HEAD.unpack(f.read(_HEAD.size))
    if magic != MAGIC:
        raise OSError(f"{path} is not a tracedag cache entry")
    copy = EntryFile(os.open(path, os.O_RDONLY), path, Entry(str(path), "", size), block, Counters())
    with copy:
        return copy.held()


def _header_size(blocks: int) -> int:
    """The header's bytes (magic, sizes, slots), rounded up to 4 KiB so the data starts on a page."""
    return -(-(_HEAD.size + 8 * blocks) // 4096) * 4096


def _create(path: Path, entry: Entry, block: int) -> None:
    """Write an empty entry file (header, every slot 0, the object's length) and link it into place."""
    tmp = path.with_name(f".tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}")
    blocks = max(1, -(-entry.size // block))
    try:
        with open(tmp, "wb") as f:
            f.write(_HEAD.pack(MAGIC, entry.size, block))
            f.truncate(_header_size(blocks) + entry.size)  # sparse: only written blocks take disk space
        with contextlib.suppress(FileExistsError):  # another process made it first: use theirs
            os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _crc_ok(data: bytes, slot: int) -> bool:
    return bool(slot & _PRESENT) and (slot & 0xFFFFFFFF) == zlib.crc32(data)


def _runs(blocks: list[int], longest: int) -> list[tuple[int, int]]:
    """Sorted block numbers as (first, last) runs of adjacent blocks, each at most ``longest`` long."""
    runs: list[tuple[int, int]] = []
    for b in sorted(set(blocks)):
        if runs and runs[-1][1] == b - 1 and b - runs[-1][0] < longest:
            runs[-1] = (runs[-1][0], b)
        else:
            runs.append((b, b))
    return runs


_POOL: list[Any] = []
_POOL_LOCK = threading.Lock()
FETCHERS = 4
"""Ranged GETs one process makes at once for one read (a read of several runs of missing blocks)."""


def _pool() -> Any:
    """The process's fetch threads (made on first use)."""
    with _POOL_LOCK:
        if not _POOL:
            from concurrent.futures import ThreadPoolExecutor

            _POOL.append(ThreadPoolExecutor(FETCHERS, thread_name_prefix="tracedag-fetch"))
        return _POOL[0]


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
