"""ConverterProcess: plain child processes (no multiprocessing) that convert, stop, restart and die with the parent."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.collector.collector_support import make_request, make_span, stored, wait_until
from tracedag.collector.spoolfmt import SEALED_SUFFIX, encode_record, segment_name
from tracedag.pipeline.ingest.processes import ConverterProcess


def _segment(data: Path, seq: int, first: int, n: int, tail: bytes = b"") -> int:
    """Write sealed segment ``seq`` holding one request of spans ``first .. first+n-1``; return n."""
    payload = make_request([make_span(i) for i in range(first, first + n)]).SerializeToString()
    spool = data / "spool"
    spool.mkdir(parents=True, exist_ok=True)
    (spool / segment_name(seq, SEALED_SUFFIX)).write_bytes(encode_record(payload, time.time_ns()) + tail)
    return n


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie nobody reaped counts as dead)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _children() -> list[int]:
    """Process ids of this process's children (those started by any of its threads)."""
    return [int(pid) for task in Path("/proc/self/task").iterdir() for pid in (task / "children").read_text().split()]


def _cmdline(pid: int) -> str:
    """Command line of ``pid`` ('' once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_two_children_convert_their_shards_and_metrics_are_summed(tmp_path: Path) -> None:
    total = sum(_segment(tmp_path, seq, seq * 100, 3 + seq) for seq in range(1, 5))
    conv = ConverterProcess(tmp_path, interval=0.1, processes=2)
    before = set(_children())  # earlier tests in this process may have left a multiprocessing pool
    conv.start()
    try:
        pids = conv.pids()
        assert len(set(pids)) == 2 and all(pid and _alive(pid) for pid in pids)
        # the kernel closes the exec status pipe (Popen returns) before it sets the new argv up:
        # for a moment after start, /proc/<pid>/cmdline reads empty
        wait_until(lambda: all("-m tracedag.pipeline.ingest.child" in _cmdline(pid) for pid in pids if pid))
        started = set(_children()) - before
        assert started == set(pids)  # the two converters and nothing else: no resource tracker
        assert conv.flush(60) and conv.pending() == 0
        assert len(stored(tmp_path)) == total
        wait_until(lambda: f"tracedag_ingest_spans_stored_total {total}\n" in conv.metrics_text())
    finally:
        conv.stop(30)
    assert not any(_alive(pid) for pid in pids if pid)


def test_stop_converts_what_is_left_then_ends_the_children(tmp_path: Path) -> None:
    conv = ConverterProcess(tmp_path, interval=60.0, processes=2)
    conv.start()
    wait_until(lambda: (tmp_path / "state" / "converter.metrics.1").exists())  # both did their first round
    total = sum(_segment(tmp_path, seq, seq * 100, 5) for seq in range(1, 4))
    t0 = time.monotonic()
    conv.stop(30)
    assert time.monotonic() - t0 < 30  # the pipe's closing ended the 60 s wait at once
    assert conv.pending() == 0 and len(stored(tmp_path)) == total
    assert not any(_alive(pid) for pid in conv.pids() if pid)


def test_dead_child_is_restarted_and_children_get_the_parents_environment(tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.setenv("TRACEDAG_FAULT", "convert.before_rename")  # the child exits with 137 there
    n = _segment(tmp_path, 1, 0, 6)
    conv = ConverterProcess(tmp_path, interval=0.1, processes=1)
    conv.start()
    try:
        first = conv.pids()[0]
        assert first is not None
        wait_until(lambda: not _alive(first))
        monkeypatch.delenv("TRACEDAG_FAULT")
        monkeypatch.setattr(logging.getLogger("tracedag.pipeline.ingest.processes"), "disabled", False)  # another test may have disabled it
        with caplog.at_level(logging.ERROR, logger="tracedag.pipeline.ingest.processes"):
            # /proc shows the exited leader as a zombie while the child's other threads still end;
            # waitpid, and so the supervisor, sees the exit only after them
            wait_until(lambda: conv.ensure_alive() or conv.pids()[0] != first)
        assert "exited with 137; restarting" in caplog.text
        assert conv.pids()[0] not in (None, first)
        assert conv.flush(60) and len(stored(tmp_path)) == n
    finally:
        conv.stop(30)


def test_children_outlive_the_thread_that_started_them(tmp_path: Path) -> None:
    conv = ConverterProcess(tmp_path, interval=0.1, processes=1)
    starter = threading.Thread(target=conv.start)
    starter.start()
    starter.join()
    try:
        time.sleep(1.0)  # PR_SET_PDEATHSIG would have fired by now had it followed the starter thread
        pid = conv.pids()[0]
        assert pid is not None and _alive(pid)
        assert conv.flush(60)
    finally:
        conv.stop(30)


_PARENT = """
import sys, time
from pathlib import Path
from tracedag.pipeline.ingest.processes import ConverterProcess
conv = ConverterProcess(Path(sys.argv[1]), interval=0.1, processes=2)
conv.start()
print(*conv.pids(), flush=True)
time.sleep(600)
"""


def test_children_die_with_their_parent(tmp_path: Path) -> None:
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 2 and all(_alive(p) for p in pids)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait(30)
    wait_until(lambda: not any(_alive(p) for p in pids), 15)


def test_child_logging_reaches_the_parents_stderr(tmp_path: Path, capfd) -> None:
    torn = encode_record(b"x" * 100, time.time_ns())[:-10]
    n = _segment(tmp_path, 7, 0, 4, tail=torn)
    conv = ConverterProcess(tmp_path, interval=0.1, processes=1)
    conv.start()
    try:
        assert conv.flush(60) and len(stored(tmp_path)) == n
    finally:
        conv.stop(30)
    assert "torn tail discarded after 1 intact records" in capfd.readouterr().err


def test_child_module_imports_only_the_standard_library_before_the_work_starts() -> None:
    code = ("import sys, tracedag.pipeline.ingest.child; "
            "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
            "{'pyarrow', 'numpy', 'duckdb', 'google', 'multiprocessing', 'subprocess'})))")
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONWARNINGS": ""})
    assert out.stdout.strip() == ""


def test_a_converter_loads_no_query_engine():
    """Converters prune spool/done/ through store.gc but never query: DuckDB stays out of their memory."""
    import subprocess
    import sys

    code = ("import sys, tracedag.pipeline.ingest.segments, tracedag.pipeline.ingest.child; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'duckdb', 'polars', 'networkx'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_sealed_segment_wakes_an_idle_converter(tmp_path: Path) -> None:
    """The spool's seal (a rename into spool/) starts a conversion at once, not at the next 60 s poll."""
    from tracedag.collector.spool import SpoolWriter

    spool = SpoolWriter(tmp_path)
    conv = ConverterProcess(tmp_path, interval=60.0, processes=2)
    conv.start()
    try:
        wait_until(lambda: (tmp_path / "state" / "converter.metrics.1").exists())  # both wait on their poll now
        payload = make_request([make_span(i) for i in range(4)]).SerializeToString()
        spool.append(payload, time.time_ns())
        spool.flush()
        wait_until(lambda: conv.pending() == 0, seconds=20, message="the seal woke no converter")
        assert len(stored(tmp_path)) == 4
    finally:
        conv.stop(30)
