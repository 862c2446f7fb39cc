"""Entry point of one converter process: ``python -P -m tracedag.pipeline.ingest.child DATA INTERVAL PARENT W N RETENTION``.

Started by ``tracedag.pipeline.ingest.processes.ConverterProcess``. The process converts the sealed
spool segments no other converter has claimed (``SpoolConverter(DATA, shard=(W, N)).run_once()``
every ``INTERVAL`` seconds, at once when a segment is sealed (an inotify watch on the spool,
``pipeline.ingest.sealwatch``; polling alone where that is unavailable) and at once again after a round
that converted something; converter 0 also compacts), writes its metrics to ``<DATA>/state/converter.metrics[.W]`` and:

- stops when its stdin reaches end of file (the parent closed the pipe): one last round converts
  what is left, then it exits 0;
- dies with its parent: ``PR_SET_PDEATHSIG`` (SIGKILL), and a parent-pid check at start and after
  every round (a dead parent also closes the pipe, which ends the wait at once; no last round then).

SIGINT and SIGTERM are ignored: the parent drives shutdown through the pipe. This module imports
only the standard library until the work starts (the converter's imports are the child's memory).
"""

from __future__ import annotations

import ctypes
import logging
import os
import select
import signal
import sys
from pathlib import Path
from typing import Any

from tracedag.pipeline.ingest.sealwatch import SealWatch, open_seal_watch
from tracedag.schemas.layout import spool_dir, state_file

logger = logging.getLogger(__name__)

METRICS_FILE = "converter.metrics"
PR_SET_PDEATHSIG = 1
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def metrics_name(w: int) -> str:
    """File name (under ``<data>/state``) of converter ``w``'s metrics snapshot."""
    return METRICS_FILE if w == 0 else f"{METRICS_FILE}.{w}"


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when the parent (the thread that started it) ends."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        logger.debug("prctl unavailable; relying on the parent-pid check and the stdin pipe")


def stop_requested(fd: int, timeout: float, watch: SealWatch | None = None) -> bool:
    """Wait up to ``timeout`` seconds, or until ``watch`` reports a seal; True once ``fd`` (the parent's
    pipe) is at end of file. The watch's events are drained: the round that follows sees their segments."""
    fds = [fd] if watch is None else [fd, watch.fileno()]
    readable, _, _ = select.select(fds, [], [], timeout)
    if watch is not None and watch.fileno() in readable:
        watch.drain()
    if fd not in readable:
        return False
    try:
        return os.read(fd, 4096) == b""
    except OSError:
        return True


def batch_scheduling() -> None:
    """Run as ``SCHED_BATCH``: the kernel lets this CPU-bound process run longer slices and does not
    let it preempt the receiver when it wakes, so acks keep their latency while conversion keeps
    the caches warm. Same share of the CPU as before; ignored where the policy is unavailable."""
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except (AttributeError, OSError) as exc:
        logger.debug("SCHED_BATCH unavailable: %s", exc)


def write_metrics(registry: Any, data: Path, name: str) -> None:
    """Replace ``<data>/state/<name>`` with the registry's Prometheus text (atomically)."""
    try:
        final = state_file(data, name)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f"{name}.tmp")
        tmp.write_text(registry.render())
        os.replace(tmp, final)
    except OSError as exc:
        logger.debug("cannot write converter metrics: %s", exc)


def convert_round(converter: Any, registry: Any, data: Path, name: str) -> bool:
    """One conversion round (errors logged, retried next round), then the metrics snapshot.

    Returns whether it converted a segment (then the next round starts at once: more may have
    been sealed meanwhile, and waiting would idle a converter that is behind).
    """
    busy = False
    try:
        busy = converter.run_once().segments > 0
    except Exception:
        logger.exception("spool conversion round failed; retrying")
    write_metrics(registry, data, name)
    return busy


def run(data: Path, interval: float, parent: int, shard: tuple[int, int], *, retention: float, fd: int = 0) -> int:
    """Convert ``shard``'s segments until the pipe ``fd`` closes or the parent dies; return the exit code."""
    import pyarrow as pa

    from tracedag.collector.metrics import REGISTRY
    from tracedag.pipeline.ingest.segments import SpoolConverter

    pa.set_cpu_count(1)  # N converter processes already use the cores; threads would only add arenas
    batch_scheduling()

    converter = SpoolConverter(data, shard=shard, done_retention=retention)
    name = metrics_name(shard[0])
    watch = open_seal_watch(spool_dir(data))  # before the first round: no seal after it goes unnoticed
    while os.getppid() == parent:
        busy = convert_round(converter, REGISTRY, data, name)
        if stop_requested(fd, 0.0 if busy else interval, watch):
            if os.getppid() == parent:
                convert_round(converter, REGISTRY, data, name)  # convert what is left, then end
            return 0
    return 0


def main(argv: list[str]) -> int:
    """Parse ``DATA INTERVAL PARENT W N RETENTION``, set the process up and run the conversion loop."""
    data, interval, parent, w, n, retention = argv
    die_with_parent()
    if os.getppid() != int(parent):
        return 0  # the parent ended before PR_SET_PDEATHSIG took effect
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")  # freed memory returns to the OS
    logging.basicConfig(level=logging.WARNING, format=LOG_FORMAT, stream=sys.stderr)
    return run(Path(data), float(interval), int(parent), (int(w), int(n)), retention=float(retention))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
