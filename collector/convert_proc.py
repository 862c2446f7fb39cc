"""Spool -> Parquet conversion in a child process, off the receivers' interpreter (and GIL).

The child runs ``tracedag.pipeline.ingest.SpoolConverter(data).run_once()`` in a loop, writes
its metrics to ``<data>/state/converter.metrics`` (merged into the parent's ``/metrics``) and
dies with its parent (``PR_SET_PDEATHSIG`` plus a parent-pid check). ``flush`` waits until no
sealed segment is left, i.e. everything sealed so far is in Parquet (or quarantined).
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing as mp
import os
import signal
import threading
import time
from multiprocessing.synchronize import Event as MpEvent
from pathlib import Path
from typing import Any

from tracedag.collector.spoolfmt import SEALED_SUFFIX

logger = logging.getLogger(__name__)

METRICS_FILE = "converter.metrics"


class ConverterProcess:
    """A supervised child process converting sealed spool segments."""

    def __init__(self, data: Path, interval: float = 0.25) -> None:
        self.data = Path(data)
        self.interval = interval
        self._ctx = mp.get_context("spawn")
        self._stop: MpEvent = self._ctx.Event()
        self._proc: Any = None
        self._lock = threading.Lock()
        self._closed = False

    def start(self) -> None:
        """Start (or restart) the child."""
        with self._lock:
            self._proc = self._ctx.Process(
                target=_child_main, args=(str(self.data), self.interval, self._stop, os.getpid()),
                name="tracedag-converter", daemon=True,
            )
            self._proc.start()

    def ensure_alive(self) -> None:
        """Restart the child if it died unexpectedly."""
        if self._closed or self._proc is None or self._proc.is_alive():
            return
        logger.error("converter process exited with %s; restarting it", self._proc.exitcode)
        self.start()

    def pending(self) -> int:
        """Return how many sealed segments wait for conversion."""
        return sum(1 for _ in (self.data / "spool").glob(f"*{SEALED_SUFFIX}"))

    def flush(self, timeout: float = 120.0) -> bool:
        """Wait until every sealed segment is converted; return False on timeout."""
        deadline = time.monotonic() + timeout
        while self.pending():
            self.ensure_alive()
            if time.monotonic() > deadline:
                logger.warning("flush: %d segments still waiting for conversion", self.pending())
                return False
            time.sleep(0.05)
        return True

    def stop(self, timeout: float = 60.0) -> None:
        """Let the child convert what is left, then end it."""
        self._closed = True
        self._stop.set()
        if self._proc is None:
            return
        self._proc.join(timeout)
        if self._proc.is_alive():
            logger.warning("converter process did not finish in %.0f s; terminating it", timeout)
            self._proc.terminate()
            self._proc.join(5)

    def metrics_text(self) -> str:
        """Return the child's last metrics snapshot (Prometheus text), or ''."""
        try:
            return (self.data / "state" / METRICS_FILE).read_text()
        except OSError:
            return ""


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        logger.debug("prctl unavailable; relying on the parent-pid check")


def _child_main(data: str, interval: float, stop: MpEvent, parent: int) -> None:
    """Entry point of the converter process."""
    _die_with_parent()
    for sig in (signal.SIGINT, signal.SIGTERM):  # the parent drives shutdown through ``stop``
        signal.signal(sig, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from tracedag.collector.metrics import REGISTRY
    from tracedag.pipeline.ingest import SpoolConverter

    converter = SpoolConverter(Path(data))
    while not stop.is_set() and os.getppid() == parent:
        _round(converter, REGISTRY, Path(data))
        stop.wait(interval)
    if os.getppid() == parent:
        _round(converter, REGISTRY, Path(data))


def _round(converter: Any, registry: Any, data: Path) -> None:
    try:
        converter.run_once()
    except Exception:
        logger.exception("spool conversion round failed; retrying")
    try:
        state = data / "state"
        state.mkdir(parents=True, exist_ok=True)
        tmp = state / f"{METRICS_FILE}.tmp"
        tmp.write_text(registry.render())
        os.replace(tmp, state / METRICS_FILE)
    except OSError as exc:
        logger.debug("cannot write converter metrics: %s", exc)
