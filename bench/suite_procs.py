"""Where the test suite's CPU goes, by kind of process (issue #33): an opt-in pytest plugin and its summary.

Record (one JSON line per test and worker in OUT; nothing is recorded unless the plugin is named)::

    SUITE_PROCS_OUT=/tmp/procs nice -n 15 python -m pytest -p bench.suite_procs -p no:cacheprovider

Summarize::

    python bench/suite_procs.py /tmp/procs

Per test: its in-process CPU (``time.process_time``, every thread), its children's CPU (``RUSAGE_CHILDREN``
deltas), and each process it started through ``subprocess.Popen`` or ``multiprocessing`` with its command line
and CPU at reap (``os.wait4``: the process and the descendants it reaped). A process that is never reaped (one
killed with its group, whose parent died first; Ray's daemons) counts nowhere, here as in ``/usr/bin/time``.
The plugin replaces ``Popen``'s waits with ``os.wait4``: a measuring tool, not for ordinary runs.
"""

from __future__ import annotations

import collections
import glob
import json
import os
import resource
import subprocess
import sys
import threading
import time
from typing import Any

_lock = threading.Lock()
_test = {"id": "<none>"}
_started: dict[int, dict[str, Any]] = {}
_done: list[dict[str, Any]] = []


def _cpu(ru: Any) -> float:
    return float(ru.ru_utime + ru.ru_stime)


def _started_now(pid: int, argv: Any) -> None:
    words = [argv] if isinstance(argv, str | bytes | os.PathLike) else list(argv)
    with _lock:
        _started[pid] = {"argv": [os.fsdecode(w) if not isinstance(w, str) else w for w in words][:12],
                         "test": _test["id"], "t0": time.time()}


def _reaped(pid: int, ru: Any) -> None:
    with _lock:
        rec = _started.pop(pid, None)
        if rec is not None:
            rec.update(cpu=_cpu(ru), wall=time.time() - rec.pop("t0"))
            _done.append(rec)


def _wait4(pid: int, flags: int) -> tuple[int, int]:
    got, status, ru = os.wait4(pid, flags)
    if got == pid:
        _reaped(pid, ru)
    return got, status


def _install() -> None:
    """``Popen`` and ``multiprocessing``'s fork/spawn launchers note their processes and reap them by ``wait4``."""
    init, poll = subprocess.Popen.__init__, subprocess.Popen._internal_poll  # type: ignore[attr-defined]

    def popen_init(self: Any, args: Any, *a: Any, **kw: Any) -> None:
        init(self, args, *a, **kw)
        _started_now(self.pid, ["sh", "-c", args] if kw.get("shell") else args)

    def try_wait(self: Any, wait_flags: int) -> tuple[int, int]:
        try:
            return _wait4(self.pid, wait_flags)
        except ChildProcessError:
            return self.pid, 0

    def internal_poll(self: Any, _deadstate: Any = None, **_: Any) -> Any:
        return poll(self, _deadstate=_deadstate, _waitpid=_wait4)

    subprocess.Popen.__init__ = popen_init  # type: ignore[method-assign]
    subprocess.Popen._try_wait = try_wait  # type: ignore[attr-defined]
    subprocess.Popen._internal_poll = internal_poll  # type: ignore[attr-defined]
    import multiprocessing.popen_fork as fork
    import multiprocessing.popen_spawn_posix as spawn

    for cls in (fork.Popen, spawn.Popen):
        launch = cls._launch

        def mp_launch(self: Any, process: Any, launch: Any = launch) -> None:
            launch(self, process)
            target = getattr(process, "_target", None)
            _started_now(self.pid, [f"<mp-{self.method}>", f"{getattr(target, '__module__', '?')}."
                                                           f"{getattr(target, '__qualname__', '?')}"])

        cls._launch = mp_launch

    def mp_poll(self: Any, flag: int = os.WNOHANG) -> int | None:
        if self.returncode is None:
            try:
                pid, status = _wait4(self.pid, flag)
            except OSError:
                return None
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode  # type: ignore[no-any-return]

    fork.Popen.poll = mp_poll


class _Recorder:
    def __init__(self, out: str) -> None:
        os.makedirs(out, exist_ok=True)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        self.file = open(os.path.join(out, f"{worker}-{os.getpid()}.jsonl"), "a")  # noqa: SIM115

    def write(self, record: dict[str, Any]) -> None:
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    def pytest_runtest_protocol(self, item: Any, nextitem: Any) -> Any:
        _test["id"] = item.nodeid
        cpu, children, wall = time.process_time(), _cpu(resource.getrusage(resource.RUSAGE_CHILDREN)), time.time()
        yield
        with _lock:
            done = list(_done)
            _done.clear()
        self.write({"test": item.nodeid, "self": time.process_time() - cpu, "wall": time.time() - wall,
                    "children": _cpu(resource.getrusage(resource.RUSAGE_CHILDREN)) - children, "procs": done})
        _test["id"] = "<between>"

    pytest_runtest_protocol.hookwrapper = True  # type: ignore[attr-defined]

    def pytest_sessionfinish(self, session: Any) -> None:
        with _lock:
            done, left = list(_done), list(_started.values())
        self.write({"test": "<session>", "self": 0.0, "children": 0.0, "wall": 0.0, "procs": done,
                    "left": left, "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"), "worker_self": time.process_time(),
                    "worker_children": _cpu(resource.getrusage(resource.RUSAGE_CHILDREN))})


def pytest_configure(config: Any) -> None:
    _install()
    config.pluginmanager.register(_Recorder(os.environ.get("SUITE_PROCS_OUT", "suite-procs")), "suite_procs_recorder")


def kind(argv: list[str]) -> str:
    """A process's kind: ``tracedag serve``, ``tracedag query``, ``SeaweedFS``, a framework agent's venv..."""
    text, first = " ".join(argv), os.path.basename(argv[0]) if argv else "?"
    if first.startswith("<"):
        return " ".join(argv[:2]) if first.startswith("<mp") else first
    shell = first in ("sh", "bash") and len(argv) > 2 and "tracedag " in argv[2]
    if "pipeline.cli import cli" in text or first == "tracedag" or shell:
        words = text.split("cli()", 1)[-1].split() if "cli()" in text else argv[1:]
        if shell:
            words = argv[2].split("tracedag ", 1)[1].split()
        elif words[:1] == ["-c"]:
            words = ["(a python -c calling cli)"]
        how = " (shell)" if shell else ""
        return "tracedag serve" if words[:1] == ["serve"] else f"tracedag CLI{how}: {words[0] if words else ''}"
    if first == "weed":
        return "SeaweedFS"
    if argv[1:3] == ["-u", "-c"]:
        return "xdist worker"
    if argv[1:2] == ["-u"]:
        argv = argv[:1] + argv[2:]
    if first.startswith("python") and len(argv) > 2 and argv[1] in ("-m", "-P"):
        mod = argv[3] if argv[1] == "-P" and len(argv) > 3 else argv[2]
        return f"python -m {mod}"
    if first.startswith("python") and len(argv) > 1 and argv[1] == "-c":
        return "python -c snippet"
    if first.startswith("python") and len(argv) > 1:
        return f"python {os.path.basename(argv[1])}"
    return first


def summary(out: str, top: int = 30) -> None:
    tests = []
    for path in glob.glob(os.path.join(out, "*.jsonl")):
        with open(path) as lines:
            tests += [json.loads(line) for line in lines]
    procs = [p for t in tests for p in t["procs"] if kind(p["argv"]) != "xdist worker"]
    own = sum(t["self"] for t in tests)
    workers = [t for t in tests if t["test"] == "<session>"]
    print(f"{len(tests)} records: tests' own CPU {own:.0f} s, their children's {sum(t['children'] for t in tests):.0f} s"
          f" ({sum(p.get('cpu', 0.0) for p in procs):.0f} s in {len(procs)} processes reaped by name)")
    for t in workers:
        print(f"  pytest {t['worker']}: own {t['worker_self']:.0f} s, children {t['worker_children']:.0f} s")
    kinds: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    files: dict[tuple[str, str], list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for p in procs:
        for key, table in ((kind(p["argv"]), kinds), ((kind(p["argv"]), p["test"].split("::")[0]), files)):
            table[key][0] += 1  # type: ignore[index]
            table[key][1] += p.get("cpu", 0.0)  # type: ignore[index]
    print(f"\n{'kind':50s} {'processes':>9s} {'CPU s':>8s}")
    for name, (n, cpu) in sorted(kinds.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"{name[:50]:50s} {n:9.0f} {cpu:8.1f}")
    print(f"\n{'kind':34s} {'file':55s} {'n':>4s} {'CPU s':>7s}")
    for (name, path), (n, cpu) in sorted(files.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"{name[:34]:34s} {path[:55]:55s} {n:4.0f} {cpu:7.1f}")


if __name__ == "__main__":
    summary(sys.argv[1] if len(sys.argv) > 1 else "suite-procs")
