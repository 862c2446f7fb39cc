"""A converter's wake-up on a seal: an inotify watch on ``<data>/spool`` for names moved into it.

The spool seals a segment by renaming ``seg-N.open`` to ``seg-N.sealed`` (``collector.spool``), which
the kernel reports as ``IN_MOVED_TO`` on the spool folder. A converter that waits on this watch (beside
its stop pipe, ``select``) starts converting as soon as a segment is sealed, instead of at its next
poll. Appends to the open segment raise no event (``IN_MODIFY`` is not watched), so an idle converter
wakes about twice a second at most. Standard library only (``ctypes``): the converter process imports
it before its work starts. Where inotify is unavailable ``open_seal_watch`` returns None and the
converter polls as before.
"""

from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)

IN_MOVED_TO = 0x00000080
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC


class SealWatch:
    """An open inotify descriptor watching a spool folder; ``select`` on it, then ``drain``."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def fileno(self) -> int:
        """The descriptor (readable once a name was moved into the folder)."""
        return self.fd

    def drain(self) -> int:
        """Read every queued event (without blocking); return the bytes read."""
        total = 0
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except (BlockingIOError, InterruptedError):
                return total
            if not chunk:
                return total
            total += len(chunk)

    def close(self) -> None:
        """Close the descriptor (its watch goes with it)."""
        os.close(self.fd)


def open_seal_watch(spool: Path) -> SealWatch | None:
    """Watch ``spool`` for sealed segments; None (poll instead) where inotify or the folder is unavailable."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
    except (OSError, AttributeError) as exc:
        logger.debug("inotify unavailable (%s); polling the spool", exc)
        return None
    if fd < 0:
        logger.debug("inotify_init1 failed (errno %d); polling the spool", ctypes.get_errno())
        return None
    if libc.inotify_add_watch(fd, os.fsencode(spool), IN_MOVED_TO) < 0:
        logger.debug("cannot watch %s (errno %d); polling the spool", spool, ctypes.get_errno())
        os.close(fd)
        return None
    return SealWatch(fd)
