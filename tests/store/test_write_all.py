"""An answer written to a pipe by a process that runs unbuffered keeps every byte while the process is stopped and
continued (``files.write_all``).

Under ``PYTHONUNBUFFERED=1`` (many container images set it; ``python -u``) ``sys.stdout.buffer`` is the raw file, and
a raw write to a pipe returns early with part of its bytes when a signal comes after some went out: a debugger or a
profiler (py-spy) stopping and continuing the process, or a shell's job control. The count it returns was ignored,
and the rest of the piece was lost: ``tracedag sql --format csv`` printed a shorter CSV, ``POST /api/sql`` answered
JSON that no longer parsed (tests/serve/test_hostile_answers.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from tests.serve.hostile_support import slow_read, stop_and_continue

ROWS, WIDTH = 20_000, 1_000  # 20 MB of CSV: hundreds of pipe-fulls, each a chance to be stopped mid-write


def _read_while_paused(proc: subprocess.Popen[bytes]) -> tuple[bytes, bytes]:
    """``proc``'s whole stdout, read slowly while it is stopped and continued, then its stderr (it has ended)."""
    done = threading.Event()
    pauser = threading.Thread(target=stop_and_continue, args=(lambda: [proc.pid], done), daemon=True)
    pauser.start()
    try:
        out = slow_read(proc.stdout)
    finally:
        done.set()
        pauser.join()
        err = proc.stderr.read() if proc.stderr else b""
        proc.wait(60)
    return out, err


def test_tracedag_sql_prints_every_row_when_stopped_and_continued_unbuffered(data: Path) -> None:
    (data / "tables").mkdir()  # an empty store: the statement reads no table
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    sql = f"select i, repeat('x', {WIDTH}) as s from range({ROWS}) t(i)"
    proc = subprocess.Popen([sys.executable, "-c", "from tracedag.pipeline.cli import cli; cli()", "sql",
                             "--data", str(data), "--format", "csv", sql],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    out, err = _read_while_paused(proc)
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    lines = out.decode().splitlines()
    assert lines[0] == '"i","s"'
    assert len(lines) == ROWS + 1, (len(lines), len(out))
    assert all(line == f'{i},"{"x" * WIDTH}"' for i, line in enumerate(lines[1:])), "a row lost bytes"


def test_write_all_writes_what_a_raw_pipe_takes_in_parts() -> None:
    """The helper alone, in a child process writing 20 MB at once to its raw stdout while it is stopped and continued."""
    code = ("import sys; from tracedag.pipeline.store.files import write_all; "
            f"n = write_all(sys.stdout.buffer, bytes(range(256)) * {20 * 4096}); sys.stderr.write(str(n))")
    proc = subprocess.Popen([sys.executable, "-u", "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = _read_while_paused(proc)
    assert proc.returncode == 0, err
    assert int(err) == len(out) == 256 * 20 * 4096 and out == bytes(range(256)) * (20 * 4096)



def test_a_table_printed_unbuffered_keeps_every_row_when_stopped_and_continued(data: Path) -> None:
    """The default output, a table, is text: under ``PYTHONUNBUFFERED=1`` Python's text stream wrote to the raw file
    and dropped the rest of a write the pipe took in part (``tracedag query ... | less`` suspended and resumed with
    job control); ``cli._whole_writes`` gives it a buffer."""
    (data / "tables").mkdir()
    rows, width = 200, 5000  # a table shows 200 rows at most: 1 MB
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    sql = f"select i, repeat('y', {width}) as s from range({rows}) t(i)"
    proc = subprocess.Popen([sys.executable, "-c", "from tracedag.pipeline.cli import cli; cli()", "sql",
                             "--data", str(data), sql], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    out, err = _read_while_paused(proc)
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    text = out.decode()
    cells = [line.split("│")[1:3] for line in text.splitlines() if "y" * width in line]
    assert [int(i) for i, _ in cells] == list(range(rows)), "a row of the table lost bytes"
