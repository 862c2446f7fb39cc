"""The cache entry of one object: a sparse file of its blocks, each CRC-checked (``objcache`` uses it).

Layout: a header (``MAGIC``, the object's size, the block size, one 8-byte slot per block), rounded up to
4 KiB, then the object's bytes at their offsets; a block's slot is ``_PRESENT | crc32`` once its bytes
are written, 0 before. Blocks are written before their slots and checked against them on every read.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import struct
import threading
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracedag.pipeline.store.cachecopy import SUFFIX as COPY_SUFFIX

logger = logging.getLogger(__name__)

BLOCK = 32 << 10
"""Bytes per cached block. A read fetches whole blocks: DuckDB reads a spans file's column chunks in runs
of 12-80 kB, so 128 KiB blocks fetched 37.5 MB for the 20 MB a ``step_stats`` query on 200k spans reads,
32 KiB ones 24 MB."""
TAIL = 128 << 10
"""A missed read that ends at an object's end also fetches the blocks of this many bytes before it (a footer)."""
TIMEOUT = 120.0
"""Seconds a read waits for another thread's fetch of the blocks it needs (then fetches them itself)."""
MAX_GET = 8 << 20
"""At most this many bytes per ranged GET: a longer run of missing blocks is fetched as several, at once."""
MAGIC = b"TDOC\x01\x00\x00\x00"
_HEAD = struct.Struct("<8sQQ")  # magic, object size, block size; then one <Q slot per block
_PRESENT = 1 << 32  # a slot is _PRESENT | crc32 once its block is written; 0 before

Fetch = Callable[[int, int], bytes]
"""``fetch(start, end)``: the object's bytes ``[start, end)`` from the store."""


@dataclass(frozen=True)
class Entry:
    """What a cached object must be: its path in the store, ETag and size."""

    path: str
    etag: str
    size: int
    modified: Any = field(default=None, compare=False)  # the listing's LastModified (a datetime), not in the key

    @property
    def name(self) -> str:
        """The file name of the entry's block copy: a hash of the key, and the size."""
        return f"{self._digest()}-{self.size}.blk"

    @property
    def copy_name(self) -> str:
        """The file name of the entry's complete copy (``cachecopy``): the object's bytes alone."""
        return f"{self._digest()}-{self.size}{COPY_SUFFIX}"

    def _digest(self) -> str:
        return hashlib.sha256(f"{self.path}\0{self.etag}\0{self.size}".encode()).hexdigest()[:40]


@dataclass
class Counters:
    """What this process's cache did (tests and the benchmark read them)."""

    hits: int = 0  # reads answered from the copy alone
    fills: int = 0  # ranged GETs made
    fetched_bytes: int = 0
    refetched: int = 0  # blocks found damaged and fetched again
    evicted: int = 0
    whole: int = 0  # objects fetched whole in one GET into a complete copy
    copy_opens: int = 0  # opens answered by a complete copy
    prefetched: int = 0  # whole fetches made in the background (``ObjectCache.prefetch``)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        """Add to counters (DuckDB reads from several threads)."""
        with self.lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)


class EntryFile:
    """One object's sparse copy, open read-write: header, block slots, then the object's bytes."""

    def __init__(self, fd: int, path: Path, entry: Entry, block: int, counters: Counters) -> None:
        self.fd, self.path, self.entry, self.block, self.counters = fd, path, entry, block, counters
        self.claims = Claims()
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

    def whole(self) -> bytes | None:
        """The object's bytes when every block is held and matches its CRC (a complete copy is made of them)."""
        slots = self.slots(0, self.blocks - 1)
        if not all(slots):
            return None
        blocks = self._blocks(0, self.blocks - 1)
        if not all(_crc_ok(data, slots[b]) for b, data in blocks):
            return None
        return b"".join(data for _, data in blocks)

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
                self.fill(missing + self._footer(first, end), fetch, needed=len(missing))
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

    def _footer(self, first: int, end: int) -> list[int]:
        """With a missed read of an object's last bytes, its missing blocks in the ``TAIL`` bytes before: a
        Parquet reader reads a footer's length, then the metadata before it (two GETs without this)."""
        if end < self.entry.size:
            return []
        start = max(0, self.entry.size - TAIL) // self.block
        if start >= first:
            return []
        return [start + i for i, slot in enumerate(self.slots(start, first - 1)) if not slot]

    def _drop(self, bad: list[int], attempt: int) -> None:
        """Clear the slots of blocks whose bytes do not match (fetched again by the caller)."""
        logger.warning("cached copy of %s: %d damaged block(s) (checksum): fetching them again",
                       self.entry.path, len(bad))
        self.counters.add(refetched=len(bad))
        for b in bad:
            os.pwrite(self.fd, bytes(8), _HEAD.size + 8 * b)

    def fill(self, blocks: list[int], fetch: Fetch, needed: int | None = None) -> None:
        """Fetch ``blocks`` (runs of adjacent ones in one ranged GET each, several at once) and store them.

        Blocks another thread of this process is fetching are not asked again: the first ``needed`` of
        ``blocks`` (all by default) are waited for, the rest left to that thread."""
        mine, others = self.claims.claim(self.entry.name, blocks, len(blocks) if needed is None else needed)
        try:
            runs = _runs(self._still_missing(mine), max(1, MAX_GET // self.block))
            if len(runs) == 1:
                self._fill_run(runs[0], fetch)
            elif runs:
                for future in [_pool().submit(self._fill_run, run, fetch) for run in runs]:
                    future.result()
        finally:
            self.claims.release(self.entry.name, mine)
        for done in others:
            done.wait(TIMEOUT)

    def _still_missing(self, blocks: list[int]) -> list[int]:
        """``blocks`` whose slot is still empty: another thread may have stored one between the caller's read
        of the slots and its claim (then fetching it again was a second GET of the same bytes)."""
        if not blocks:
            return []
        first = min(blocks)
        slots = self.slots(first, max(blocks))
        return [b for b in blocks if not slots[b - first]]

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


class Claims:
    """The blocks this process's threads are fetching now, so that two threads (DuckDB reads one file's row
    groups from several) do not GET the same bytes; another process may, and writes the same bytes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fetching: dict[tuple[str, int], threading.Event] = {}

    def claim(self, name: str, blocks: list[int], needed: int) -> tuple[list[int], list[threading.Event]]:
        """(the blocks the caller fetches, the events of the first ``needed`` blocks others are fetching)."""
        mine: list[int] = []
        others: list[threading.Event] = []
        with self._lock:
            for i, b in enumerate(blocks):
                busy = self._fetching.get((name, b))
                if busy is None:
                    self._fetching[(name, b)] = threading.Event()
                    mine.append(b)
                elif i < needed:
                    others.append(busy)
        return mine, others

    def release(self, name: str, blocks: list[int]) -> None:
        """The caller's fetch of ``blocks`` ended (stored or failed): wake who waits for them."""
        with self._lock:
            for b in blocks:
                done = self._fetching.pop((name, b), None)
                if done is not None:
                    done.set()


def inspect(path: Path) -> tuple[int, int]:
    """An entry file's (bytes held whole, damaged blocks): what a test or ``du`` of the cache cannot tell.
    A complete copy holds all its bytes (checked once, when it was made)."""
    if path.suffix == COPY_SUFFIX:
        return path.stat().st_size, 0
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
