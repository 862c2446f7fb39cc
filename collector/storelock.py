"""One collector per data directory: an exclusive ``flock`` on ``<data>/state/collector.lock``.

The lock is taken before spool recovery (recovery seals or removes ``.open`` segments, which
would pull the ground from under a collector still appending to them) and held until the
collector stops. The file names the holder (pid, host, ports, start time) so a second
``tracedag collect`` on the same store refuses with a message an operator can act on. The kernel
drops a ``flock`` when its process dies, so the lock of a crashed or SIGKILLed collector is taken
over at the next start without any clean-up; the file is never deleted (deleting it would let two
processes lock two different inodes under the same name).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

from tracedag.schemas.errors import TracedagError
from tracedag.schemas.fsio import lock_fd, open_lock_file
from tracedag.schemas.layout import COLLECTOR_LOCK, state_file

logger = logging.getLogger(__name__)

class StoreInUse(TracedagError):  # type: ignore[misc,unused-ignore]
    """Another running collector holds the data directory."""

    def __init__(self, data: Path, holder: dict[str, Any]) -> None:
        who = describe_holder(holder)
        super().__init__(
            f"{data} is in use by a running collector ({who}); stop it first, or start this one "
            "with another --data directory"
        )
        self.data = data
        self.holder = holder


def describe_holder(holder: dict[str, Any]) -> str:
    """One line naming a lock holder: pid, host and ports as far as known."""
    parts = [f"pid {holder.get('pid', '?')}"]
    if holder.get("hostname"):
        parts.append(f"on {holder['hostname']}")
    for key, label in (("http_port", "OTLP/HTTP port"), ("grpc_port", "OTLP/gRPC port")):
        if holder.get(key):
            parts.append(f"{label} {holder[key]}")
    return ", ".join(parts)


class StoreLock:
    """The exclusive collector lock of one data directory."""

    def __init__(self, data: Path) -> None:
        self.data = Path(data)
        self.path = state_file(self.data, COLLECTOR_LOCK)
        self._fd: int | None = None
        self._holder: dict[str, Any] = {}

    def acquire(self) -> StoreLock:
        """Take the lock or raise ``StoreInUse`` naming the running collector."""
        fd = open_lock_file(self.path)
        if not lock_fd(fd, wait=False):
            holder = _read_holder(fd)
            os.close(fd)
            raise StoreInUse(self.data, holder) from None
        previous = _read_holder(fd)
        if previous.get("pid") and previous.get("pid") != os.getpid():
            logger.info("taking over the collector lock of %s (no longer running)", describe_holder(previous))
        self._fd = fd
        self._holder = {"pid": os.getpid(), "hostname": socket.gethostname(), "started_unix": int(time.time())}
        self._write()
        return self

    def announce(self, **fields: Any) -> None:
        """Record more about the holder (the bound ports) for the message a second collector prints."""
        self._holder.update(fields)
        self._write()

    def release(self) -> None:
        """Drop the lock (closing the descriptor releases the ``flock``)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _write(self) -> None:
        if self._fd is None:
            return
        text = json.dumps(self._holder, sort_keys=True).encode() + b"\n"
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, text, 0)


def _read_holder(fd: int) -> dict[str, Any]:
    try:
        raw = os.pread(fd, 4096, 0)
        holder = json.loads(raw) if raw.strip() else {}
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}
