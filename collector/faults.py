"""Environment-controlled crash points for crash-recovery tests.

``TRACEDAG_FAULT=<point>[,<point>...]`` makes the process exit with ``os._exit(137)`` (no
cleanup, like SIGKILL) the first time it reaches one of the named points, or after skipping
``TRACEDAG_FAULT_SKIP`` hits. Points: ``after_write_before_fsync``, ``after_fsync_before_ack``
(spool writer); converters may add their own names. Unset in production: ``hit`` is a set lookup.

``TRACEDAG_FAULT_RAISE=<point>[,...]`` makes ``fail(point)`` raise ``InjectedFault`` (a bug
stand-in) every time, for tests of how a receiver answers an unexpected exception. Point:
``export`` (each export request, before decoding).
"""

from __future__ import annotations

import logging
import os
import threading

logger = logging.getLogger(__name__)

_POINTS = frozenset(p.strip() for p in os.environ.get("TRACEDAG_FAULT", "").split(",") if p.strip())
_SKIP = int(os.environ.get("TRACEDAG_FAULT_SKIP", "0") or 0)
_RAISE = frozenset(p.strip() for p in os.environ.get("TRACEDAG_FAULT_RAISE", "").split(",") if p.strip())
_hits = 0
_lock = threading.Lock()


def hit(point: str) -> None:
    """Exit the process at once if ``point`` is an armed fault point."""
    global _hits
    if point not in _POINTS:
        return
    with _lock:
        _hits += 1
        if _hits <= _SKIP:
            return
    logger.critical("fault injection: exiting at %s", point)
    os._exit(137)


class InjectedFault(RuntimeError):
    """Raised by ``fail`` at an armed point; stands for a bug nobody anticipated."""


def fail(point: str) -> None:
    """Raise ``InjectedFault`` if ``point`` is armed in ``TRACEDAG_FAULT_RAISE``."""
    if point in _RAISE:
        raise InjectedFault(f"fault injection: unexpected exception at {point}")
