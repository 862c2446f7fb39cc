"""Per-stage timing of a build, logged at debug level (``tracedag -vv build``) and kept for the bench."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

logger = logging.getLogger(__name__)

TOTALS: dict[str, list[float]] = {}
"""Stage name -> [wall seconds, cpu seconds] accumulated in this process."""


@contextmanager
def stage(name: str) -> Iterator[None]:
    """Time the enclosed block (wall and process CPU) under ``name``."""
    t, c = time.perf_counter(), time.process_time()
    try:
        yield
    finally:
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        acc = TOTALS.setdefault(name, [0.0, 0.0])
        acc[0] += wall
        acc[1] += cpu
        logger.debug("%s: %.3fs wall, %.3fs cpu", name, wall, cpu)
