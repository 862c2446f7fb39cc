"""Complete copies in the object cache: an object's bytes as a plain local file that DuckDB reads natively.

A block copy (``cacheentry``) is read through Python calls (~90 opens and ~190 reads a query). Once every
byte of an object is held, the cache keeps it as ``<key>.obj``: exactly the object's bytes, which a view can
name in ``read_parquet`` like a local store's file. A copy is checked once, when it is made: its length (its bytes
come from a GET of the listed version only, ``If-Match``), or, made from a block copy, every block's CRC-32;
then it is written to a temporary file, flushed to disk and linked into place, so a crash leaves no partial
copy under the name. (Checking an S3 ETag's MD5 cost 60 ms CPU per 15 MB here: not done.) A read after that is a plain read of a local file, unchecked, as a local store's files are; a copy
whose length is not the object's (truncated) is removed and fetched again.

A connection whose views name a copy **pins** it: a shared ``flock`` on an open descriptor, held until the
connection is gone. Eviction removes a copy only under an exclusive ``flock`` it gets without waiting, so a
copy some process reads natively is skipped, and a pin taken after the removal sees that its path no longer
names the file it opened (then the view reads the object's URL instead).
"""

from __future__ import annotations

import abc
import contextlib
import logging
import os
import threading
import uuid
import weakref
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no pins, so no native reads (eviction could not see them)
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

SUFFIX = ".obj"
PINS_MAX = 2048
"""At most this many copies pinned by one process (an open descriptor each); past it a view reads the URL."""


class CopyMismatch(OSError):
    """The bytes fetched for a complete copy are not the object's (its length)."""


def check_whole(data: bytes, size: int, what: str) -> None:
    """Raise ``CopyMismatch`` unless ``data`` has the object's length (a body cut short)."""
    if len(data) != size:
        raise CopyMismatch(f"{what}: asked for its {size} bytes, the store sent {len(data)}")


def write_copy(path: Path, data: bytes) -> None:
    """``data`` as the file ``path``: written under a temporary name, flushed to disk, linked into place (a
    copy already there, made by another process from the same object, is kept)."""
    tmp = path.with_name(f".tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fdatasync(fd)
        finally:
            os.close(fd)
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def open_copy(path: Path, size: int) -> int | None:
    """A read-only descriptor of the complete copy ``path`` when it holds ``size`` bytes; a copy of another
    length is damaged (truncated, or written over): it is removed and None returned, as when there is none."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    if os.fstat(fd).st_size == size:
        return fd
    os.close(fd)
    logger.warning("complete cached copy %s is %d bytes, not %d: fetching it again",
                   path, _size(path), size)
    remove_unpinned(path)
    return None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return -1


def remove_unpinned(path: Path) -> bool:
    """Remove the copy ``path`` unless a process pins it (then it is kept: False)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return True
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return True
    finally:
        os.close(fd)  # the lock goes with it


class Pins:
    """The complete copies this process's connections read natively: one descriptor with a shared lock per
    copy, counted per connection that names it."""

    def __init__(self, most: int = PINS_MAX) -> None:
        self.most = most
        self._lock = threading.Lock()
        self._held: dict[str, list[int]] = {}  # path -> [descriptor, connections]

    def pin(self, path: Path, size: int) -> bool:
        """Pin the copy ``path`` of ``size`` bytes for one more connection (False: none usable, read the URL)."""
        key = str(path)
        with self._lock:
            held = self._held.get(key)
            if held is not None:
                held[1] += 1
                return True
            if fcntl is None or len(self._held) >= self.most:
                return False
            fd = _locked(path, size)
            if fd is None:
                return False
            self._held[key] = [fd, 1]
            return True

    def release(self, paths: list[str]) -> None:
        """One connection that named ``paths`` is gone: unpin those no other connection names."""
        with self._lock:
            for key in paths:
                held = self._held.get(key)
                if held is None:
                    continue
                held[1] -= 1
                if held[1] <= 0:
                    del self._held[key]
                    os.close(held[0])

    def held(self) -> list[str]:
        """The paths pinned now (tests)."""
        with self._lock:
            return sorted(self._held)

    def tie(self, owner: object, paths: list[str]) -> None:
        """Release ``paths`` (pinned for ``owner``) when ``owner`` is garbage collected."""
        if paths:
            weakref.finalize(owner, self.release, list(paths))


def _locked(path: Path, size: int) -> int | None:
    """A descriptor of ``path`` with a shared lock, when it is still the linked copy and ``size`` bytes long."""
    assert fcntl is not None
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # an eviction holds it exclusively only to unlink
        st = os.fstat(fd)
        if st.st_size == size and os.stat(path).st_ino == st.st_ino:
            return fd
    except OSError:  # being removed now, or removed between the open and the lock
        pass
    os.close(fd)
    return None


class ThreadFile(abc.ABC):
    """A read-only file of ``size`` bytes whose position is kept per thread: DuckDB reads a registered
    filesystem's file from several threads at once, each as ``seek`` then ``read`` (two calls, the GIL
    released between them), so on one shared position a thread would read at another's offset (a Parquet
    footer then fails to decode, "invalid TType"). Subclasses give ``read``, ``close`` and ``closed``."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._where = threading.local()

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        """Move this thread's position."""
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self.tell(), os.SEEK_END: self.size}[whence]
        self._where.pos = max(0, base + offset)
        return int(self._where.pos)

    def tell(self) -> int:
        """This thread's position."""
        return int(getattr(self._where, "pos", 0))

    @abc.abstractmethod
    def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes (all when negative) from this thread's position, which moves past them."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release what the file holds."""

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def __enter__(self) -> ThreadFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class CopyReader(ThreadFile):
    """A read-only file over a complete copy's descriptor (``BlockReader``'s interface)."""

    def __init__(self, fd: int, size: int) -> None:
        super().__init__(size)
        self._fd = fd

    @property
    def closed(self) -> bool:
        """Whether ``close`` was called."""
        return self._fd < 0

    def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes (all that is left when negative) from this thread's position."""
        pos = self.tell()
        want = self.size - pos if n is None or n < 0 else min(n, self.size - pos)
        data = os.pread(self._fd, max(0, want), pos) if want > 0 else b""
        self._where.pos = pos + len(data)
        return data

    def close(self) -> None:
        """Close the file."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
