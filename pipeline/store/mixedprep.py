"""The live collector's child process that writes the waiting conversations' rows of the polled queries (issue #31).

``store.mixed.prepare_wanted`` costs 0.5-0.8 s of CPU after a live round. In a thread of the collector it slowed
the rounds on a busy 2-core machine (``bench/live.py`` at load 5-7: ack -> root cause p99 x1.46, collector CPU +10 %),
so it runs here, in a process of its own at a lower priority (``NICE``): it uses the CPU the rounds leave, and when
there is none the polls compute as before. The collector writes a line to its stdin after each round that scored
(``PrepChild.poke``); the child runs ``prepare_wanted`` once per burst of lines and exits at the end of its stdin.

    python -m tracedag.pipeline.store.mixedprep DATA
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

logger = logging.getLogger(__name__)

NICE = 10
"""How much lower the child's priority is than the collector's."""


class PrepChild:
    """The child process, started by ``start``; ``poke`` after a round, ``stop`` at the collector's end."""

    def __init__(self, data: Path) -> None:
        self.data = data
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> PrepChild:
        self.proc = subprocess.Popen([sys.executable, "-m", __name__, str(self.data)], stdin=subprocess.PIPE)
        _lower(self.proc.pid)
        return self

    def poke(self) -> None:
        """A round scored: the child prepares the polled queries again (a child gone: nothing; logged once)."""
        proc = self.proc
        if proc is None or proc.stdin is None:
            return
        try:
            proc.stdin.write(b"\n")
            proc.stdin.flush()
        except OSError as e:
            logger.warning("the polled queries' child is gone (%s); the polls compute their rows", e)
            self.proc = None

    def stop(self, seconds: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(seconds)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()


def _lower(pid: int) -> None:
    """Lower the child's priority from here (a ``preexec_fn`` is unsafe in the collector's threads: it runs between
    fork and exec, where a lock another thread held stays held)."""
    try:
        os.setpriority(os.PRIO_PROCESS, pid, min(os.getpriority(os.PRIO_PROCESS, 0) + NICE, 19))
    except OSError as e:  # gone already, or not allowed: it runs at the collector's priority
        logger.info("the polled queries' child keeps the collector's priority: %s", e)


def main(data: Path) -> None:
    """Run ``prepare_wanted`` after each burst of lines on stdin, until its end."""
    from tracedag.pipeline.store.mixed import POLLS, prepare_wanted

    poked, done = threading.Event(), threading.Event()

    def read() -> None:
        for _ in sys.stdin.buffer:
            poked.set()
        done.set()
        poked.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        while True:
            poked.wait()
            poked.clear()
            if done.is_set():
                return
            try:
                prepare_wanted(data)
            except Exception as e:  # a file compacted away, a store being written: the next round's poke
                logger.info("the polled queries' rows were not written: %s", e)
    finally:
        if POLLS.current is not None:
            POLLS.drop(POLLS.current[2])


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    main(Path(sys.argv[1]))
