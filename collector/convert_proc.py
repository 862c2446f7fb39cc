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

ENV_CONVERTERS = "TRACEDAG_CONVERTERS"
"""Number of converter processes (default 2); each converts the segments whose sequence is ``w`` mod N."""


def default_processes() -> int:
    """Converter processes to run: ``$TRACEDAG_CONVERTERS`` or 2 (capped by the CPU count)."""
    try:
        return max(1, int(os.environ.get(ENV_CONVERTERS, "")))
    except ValueError:
        return max(1, min(2, os.cpu_count() or 1))


class ConverterProcess:
    """Supervised child processes converting sealed spool segments (split by segment sequence)."""

    def __init__(self, data: Path, interval: float = 0.25, processes: int | None = None) -> None:
        self.data = Path(data)
        self.interval = interval
        self.processes = processes or default_processes()
        self._ctx = mp.get_context("spawn")
        self._stop: MpEvent = self._ctx.Event()
        self._procs: list[Any] = [None] * self.processes
        self._lock = threading.Lock()
        self._closed = False

    def start(self) -> None:
        """Start (or restart) the children."""
        for w in range(self.processes):
            self._start(w)

    def _start(self, w: int) -> None:
        with self._lock:
            self._procs[w] = self._ctx.Process(
                target=_child_main,
                args=(str(self.data), self.interval, self._stop, os.getpid(), (w, self.processes)),
                name=f"tracedag-converter-{w}", daemon=True,
            )
            self._procs[w].start()

    def ensure_alive(self) -> None:
        """Restart a child that died unexpectedly."""
        for w, proc in enumerate(self._procs):
            if self._closed or proc is None or proc.is_alive():
                continue
            logger.error("converter process %d exited with %s; restarting it", w, proc.exitcode)
            self._start(w)

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
        deadline = time.monotonic() + timeout
        for proc in self._procs:
            if proc is None:
                continue
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                logger.warning("converter process did not finish in %.0f s; terminating it", timeout)
                proc.terminate()
                proc.join(5)

    def metrics_text(self) -> str:
        """Return the children's last metrics snapshots (Prometheus text, samples summed), or ''."""
        texts = []
        for w in range(self.processes):
            try:
                texts.append((self.data / "state" / _metrics_name(w)).read_text())
            except OSError:
                continue
        return merge_metrics(texts)


def _metrics_name(w: int) -> str:
    return METRICS_FILE if w == 0 else f"{METRICS_FILE}.{w}"


def merge_metrics(texts: list[str]) -> str:
    """Merge Prometheus texts of the same metrics: comments once, equal samples summed."""
    if len(texts) <= 1:
        return texts[0] if texts else ""
    order: list[str] = []
    values: dict[str, float] = {}
    for text in texts:
        for line in text.splitlines():
            name, _, value = line.rpartition(" ")
            if line.startswith("#") or not name:
                if line not in values and line not in order:
                    order.append(line)
                continue
            if name not in values:
                order.append(name)
                values[name] = 0.0
            try:
                values[name] += float(value)
            except ValueError:
                continue
    return "".join(f"{k} {_num(values[k])}\n" if k in values else f"{k}\n" for k in order)


def _num(v: float) -> str:
    return str(int(v)) if v.is_integer() else repr(v)


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        logger.debug("prctl unavailable; relying on the parent-pid check")


def _child_main(data: str, interval: float, stop: MpEvent, parent: int, shard: tuple[int, int] = (0, 1)) -> None:
    """Entry point of a converter process (converts the segments of ``shard``)."""
    _die_with_parent()
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")  # freed memory returns to the OS (malloc_trim)
    for sig in (signal.SIGINT, signal.SIGTERM):  # the parent drives shutdown through ``stop``
        signal.signal(sig, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from tracedag.collector.metrics import REGISTRY
    from tracedag.pipeline.ingest import SpoolConverter

    converter = SpoolConverter(Path(data), shard=shard)
    name = _metrics_name(shard[0])
    while not stop.is_set() and os.getppid() == parent:
        _round(converter, REGISTRY, Path(data), name)
        stop.wait(interval)
    if os.getppid() == parent:
        _round(converter, REGISTRY, Path(data), name)


def _round(converter: Any, registry: Any, data: Path, name: str = METRICS_FILE) -> None:
    try:
        converter.run_once()
    except Exception:
        logger.exception("spool conversion round failed; retrying")
    try:
        state = data / "state"
        state.mkdir(parents=True, exist_ok=True)
        tmp = state / f"{name}.tmp"
        tmp.write_text(registry.render())
        os.replace(tmp, state / name)
    except OSError as exc:
        logger.debug("cannot write converter metrics: %s", exc)
