"""Whose CPU a benchmark's run used: a process tree's CPU seconds, and the machine's cores busy and whose.

``bench/live.py`` prints, for the time its load runs, how many of the machine's cores are busy (``/proc/stat``) and
whose: the collector with its converters, the polls' process, the load's clients, anything else (Linux only).
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` and its live children, per /proc (0 where unreadable).

    The children of every thread count: the collector starts its converters from a thread of their own
    (``pipeline.ingest.processes._Launcher``), and ``/proc/<pid>/task/<pid>/children`` lists only the main
    thread's (counting those alone left the converters out)."""
    total, tick = 0.0, os.sysconf("SC_CLK_TCK")
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick
        kids = [c for task in Path(f"/proc/{pid}/task").iterdir() for c in children(task)]
    except OSError:
        return total
    return total + sum(cpu_seconds(int(c)) for c in kids)


@dataclass
class Cores:
    """CPU seconds at one moment: the machine's busy and total (``/proc/stat``, every core), the collector with its
    converters, the polls' process, and this process's reaped children (the load's clients, joined at the end)."""

    busy: float
    total: float
    collector: float
    polls: float
    clients: float
    at: float

    @classmethod
    def now(cls, collector: int, polls: int) -> Cores:
        ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]  # user .. steal
        idle = ticks[3] + ticks[4]  # idle, iowait
        tick = os.sysconf("SC_CLK_TCK")
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return cls((sum(ticks) - idle) / tick, sum(ticks) / tick, cpu_seconds(collector), cpu_seconds(polls),
                   children.ru_utime + children.ru_stime, time.monotonic())

    def since(self, before: Cores) -> dict[str, float]:
        """Cores in use on average between ``before`` and this moment: the machine's (busy share of every core, and
        their number), the collector's, the polls', the clients', and the rest (other processes of the machine)."""
        seconds = max(self.at - before.at, 1e-9)
        used = {k: (getattr(self, k) - getattr(before, k)) / seconds for k in ("busy", "collector", "polls", "clients")}
        cores = (self.total - before.total) / seconds
        return {"busy_share": used["busy"] / cores if cores else float("nan"), "cores": cores,
                "cores_collector": used["collector"], "cores_polls": used["polls"], "cores_clients": used["clients"],
                "cores_other": used["busy"] - used["collector"] - used["polls"] - used["clients"]}


def children(task: Path) -> list[str]:
    """Process ids of the children one thread started ([] once the thread has ended)."""
    try:
        return (task / "children").read_text().split()
    except OSError:
        return []


def cores_cell(f: dict[str, float]) -> str:
    """The machine's cores in use while the load ran, of how many, and whose: collector (with its converters), the
    polls, the load's clients, anything else on the machine."""
    if "cores" not in f:
        return ""
    return (f"{f['busy_share'] * f['cores']:.2f}/{f['cores']:.0f} = {f['cores_collector']:.2f} + {f['cores_polls']:.2f} + "
            f"{f['cores_clients']:.2f} + {f['cores_other']:.2f}")
