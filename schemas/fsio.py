"""The durability primitives every writer shares: directory fsync and the one lock style (``flock``).

Light on imports: the collector's request path uses them too.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """fsync a directory so that a new or renamed entry in it survives a crash."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def lock_fd(fd: int, wait: bool = True) -> bool:
    """Take an exclusive ``flock`` on an open descriptor; without ``wait``, False when another holds it.

    The lock lasts until the descriptor is closed and dies with the process, so a crashed
    holder never leaves a stale lock behind.
    """
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def open_lock_file(path: Path) -> int:
    """Open (creating it and its folder) the lock file ``path``; the descriptor is not inherited."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)


@contextmanager
def file_lock(path: Path, wait: bool = True) -> Iterator[bool]:
    """Hold an exclusive ``flock`` on ``path`` for the ``with`` block; yields whether it is held.

    With ``wait`` (the default) it blocks until the lock is free and always yields True; without,
    it yields False at once when another process holds it (the block must then skip its work).
    """
    fd = open_lock_file(path)
    try:
        yield lock_fd(fd, wait)
    finally:
        os.close(fd)  # closing the descriptor releases the lock
