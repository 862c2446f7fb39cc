"""E39 fsync-before-ack audit: the real ``tracedag collect`` process traced by strace.

Every ``HTTP/1.1 200`` written on a connection must come after an fdatasync/fsync of the spool
segment that holds that request's batch (found by a unique marker in the written record), new
spool segments must be followed by an fsync of the spool directory before any of their batches
is acknowledged, and every rename that publishes a Parquet file or seals a segment must be
followed by an fsync of the destination directory. The order used is strace's own event order
(line order, with ``<unfinished ...>``/``resumed`` pairs giving entry and exit separately).
"""

from __future__ import annotations

import http.client
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tests.collector.collector_support import PB, make_request, make_span
from tracedag.pipeline.store.views import connect

STRACE = "/usr/bin/strace"
SYSCALLS = "fsync,fdatasync,write,writev,sendto,sendmsg,rename,renameat,renameat2,openat"
CLIENTS = 8
REQUESTS_PER_CLIENT = 3

_LINE = re.compile(r"^(\d+)\s+\S+\s+(.*)$")
_CALL = re.compile(r"^(\w+)\((.*)$")
_RESUMED = re.compile(r"^<\.\.\. (\w+) resumed>(.*)$")
_FD_PATH = re.compile(r"^\d+<([^>]*)>")
_PEER = re.compile(r"^\d+<TCP(?:v6)?:\[[^\]]*->[^\]]*:(\d+)\]>")
_STRINGS = re.compile(r'"((?:[^"\\]|\\.)*)"')


@dataclass
class Call:
    """One syscall of the trace: name, argument text, result text, entry and exit positions."""

    pid: int
    name: str
    args: str
    result: str
    entry: int
    exit: int

    @property
    def fd_path(self) -> str:
        """The path strace printed for the first (fd) argument, or ""."""
        m = _FD_PATH.match(self.args)
        return m.group(1) if m else ""

    @property
    def ok(self) -> bool:
        """Whether the call returned without error."""
        return not self.result.strip().startswith("= -1")


def parse_strace(text: str) -> list[Call]:
    """Parse ``strace -f -tt -yy`` output into calls, pairing unfinished/resumed lines per pid."""
    calls: list[Call] = []
    pending: dict[int, Call] = {}
    for index, line in enumerate(text.splitlines()):
        m = _LINE.match(line)
        if not m:
            continue
        pid, rest = int(m.group(1)), m.group(2)
        resumed = _RESUMED.match(rest)
        if resumed and pid in pending:
            call = pending.pop(pid)
            call.args += resumed.group(2)
            call.result, call.exit = _result(call.args), index
            continue
        cm = _CALL.match(rest)
        if not cm:
            continue
        body = cm.group(2)
        call = Call(pid, cm.group(1), body, _result(body), index, index)
        if body.endswith("<unfinished ...>"):
            call.args = body[: -len("<unfinished ...>")]
            pending[pid] = call
        calls.append(call)
    return calls


def _result(args: str) -> str:
    cut = args.rfind(") = ")
    return args[cut + 2 :] if cut >= 0 else ""


def _stem(path: str) -> str:
    """A spool segment's identity across its .open -> .sealed rename."""
    name = os.path.basename(path)
    return name.split(".", 1)[0] if name.startswith("seg-") else path


def _syncs(calls: list[Call]) -> list[Call]:
    return [c for c in calls if c.name in ("fsync", "fdatasync") and c.ok]


def _response_writes(calls: list[Call]) -> dict[int, list[Call]]:
    """HTTP 200 responses written, by the client's port (from the socket's peer address)."""
    out: dict[int, list[Call]] = {}
    for c in calls:
        if c.name in ("sendto", "sendmsg", "write", "writev") and "HTTP/1.1 200 " in c.args:
            peer = _PEER.match(c.args)
            if peer:
                out.setdefault(int(peer.group(1)), []).append(c)
    return out


def _batch_write(calls: list[Call], marker: str) -> Call:
    found = [c for c in calls if c.name in ("write", "writev") and marker in c.args and "/spool/seg-" in c.fd_path]
    assert len(found) == 1, f"expected one spool write holding {marker}, found {len(found)}"
    return found[0]


def audit(calls: list[Call], markers: dict[int, list[str]], spool_dir: str) -> list[str]:
    """Return every violation of the fsync-before-ack and directory-fsync rules."""
    problems: list[str] = []
    syncs = _syncs(calls)
    responses = _response_writes(calls)
    first_ack: dict[str, int] = {}
    for port, wanted in markers.items():
        sent = responses.get(port, [])
        if len(sent) != len(wanted):
            problems.append(f"port {port}: {len(sent)} responses of 200 traced for {len(wanted)} requests")
            continue
        for marker, reply in zip(wanted, sent, strict=True):
            write = _batch_write(calls, marker)
            segment = _stem(write.fd_path)
            covered = any(
                _stem(s.fd_path) == segment and s.entry > write.exit and s.exit < reply.entry for s in syncs
            )
            if not covered:
                problems.append(f"{marker}: 200 on port {port} without an fsync of {segment} in between")
            first_ack[segment] = min(first_ack.get(segment, reply.entry), reply.entry)
    problems += _segment_dir_syncs(calls, syncs, spool_dir, first_ack)
    problems += _rename_dir_syncs(calls, syncs)
    return problems


def _segment_dir_syncs(calls: list[Call], syncs: list[Call], spool_dir: str, first_ack: dict[str, int]) -> list[str]:
    """Each created segment: a spool directory fsync after the create and before its first ack."""
    problems = []
    for c in calls:
        if c.name != "openat" or "O_CREAT" not in c.args or not c.ok or ".open" not in c.result:
            continue
        segment = _stem(c.result.split("<", 1)[-1].rstrip(">"))
        limit = first_ack.get(segment, len(calls) + 1)
        if not any(s.fd_path == spool_dir and c.exit < s.entry and s.exit < limit for s in syncs):
            problems.append(f"new segment {segment}: no spool directory fsync before its first ack")
    return problems


def _rename_dir_syncs(calls: list[Call], syncs: list[Call]) -> list[str]:
    """Each rename publishing a Parquet file or sealing a segment: a later fsync of its directory."""
    problems = []
    for c in calls:
        if c.name not in ("rename", "renameat", "renameat2") or not c.ok:
            continue
        paths = _STRINGS.findall(c.args)
        if len(paths) < 2 or not paths[1].endswith((".parquet", ".sealed")):
            continue
        folder = os.path.dirname(paths[1])
        if not any(s.fd_path == folder and s.entry > c.exit for s in syncs):
            problems.append(f"rename to {paths[1]}: no fsync of {folder} afterwards")
    return problems


def test_e39_auditor_catches_an_ack_before_fsync():
    """The auditor itself fails on a trace where the 200 goes out before the fdatasync."""
    seg = "/d/spool/seg-1.open"
    good = [
        f'5 06:00:00.000001 openat(AT_FDCWD</d>, "{seg}", O_WRONLY|O_CREAT|O_EXCL, 0644) = 9<{seg}>',
        "5 06:00:00.000002 fsync(10</d/spool>) = 0",
        f'5 06:00:00.000003 writev(9<{seg}>, [{{iov_base="\\nmk-c00-r00", iov_len=9}}], 1) = 9',
        f"5 06:00:00.000004 fdatasync(9<{seg}> <unfinished ...>",
        '6 06:00:00.000005 sendto(8<TCP:[127.0.0.1:80->127.0.0.1:5000]>, "HTTP/1.1 200 OK\\r\\n", 17, 0, NULL, 0) = 17',
        "5 06:00:00.000006 <... fdatasync resumed>) = 0",
    ]
    markers = {5000: ["mk-c00-r00"]}
    assert audit(parse_strace("\n".join(good)), markers, "/d/spool") != []  # 200 before the fsync returned
    fixed = good[:4] + [good[5], good[4]]
    assert audit(parse_strace("\n".join(fixed)), markers, "/d/spool") == []
    no_dir_sync = [fixed[0], *fixed[2:]]
    assert any("directory fsync" in p for p in audit(parse_strace("\n".join(no_dir_sync)), markers, "/d/spool"))


def _start_traced(tmp_path: Path) -> tuple[subprocess.Popen, int, Path]:
    """Start ``strace -f ... tracedag collect``; return strace's process, the HTTP port and the trace file."""
    strace = STRACE if os.access(STRACE, os.X_OK) else shutil.which("strace")
    assert strace, f"E39 needs strace ({STRACE} or on PATH); it is not installed"
    trace = tmp_path / "trace.txt"
    cmd = [strace, "-f", "-tt", "-yy", "-s", "256", "--seccomp-bpf", "-o", str(trace), "-e", f"trace={SYSCALLS}",
           sys.executable, "-c", "from tracedag.pipeline.cli import cli; cli()", "collect", "--http-port", "0",
           "--grpc-port", "0", "--data", str(tmp_path / "data")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    deadline = time.time() + 60
    while time.time() < deadline:
        line = proc.stdout.readline()
        m = re.search(r"http_port=(\d+)", line)
        if m:
            return proc, int(m.group(1)), trace
        if not line:
            break
    proc.kill()
    err = proc.stderr.read() if proc.stderr else ""
    raise AssertionError(f"the collector did not start under strace (ptrace forbidden?): {err[-2000:]}")


def _client(port: int, index: int, markers: dict[int, list[str]], statuses: list[int]) -> None:
    """One keep-alive connection sending REQUESTS_PER_CLIENT marked requests."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.connect()
    assert conn.sock is not None
    local_port = conn.sock.getsockname()[1]
    sent = markers.setdefault(local_port, [])
    for r in range(REQUESTS_PER_CLIENT):
        marker = f"mk-c{index:02d}-r{r:02d}"
        span = make_span(index * 100 + r)
        conn.request("POST", "/v1/traces", make_request([span], service=marker).SerializeToString(),
                     {"Content-Type": PB})
        resp = conn.getresponse()
        resp.read()
        statuses.append(resp.status)
        sent.append(marker)
    conn.close()


def _wait_stored(data: Path, expected: int, timeout: float) -> None:
    deadline = time.time() + timeout
    count = 0
    while time.time() < deadline:
        if (data / "tables" / "spans").exists():
            con = connect(data, tables=["spans"])  # a count of spans_all: not every view and macro each poll
            try:
                count = con.execute("select count(*) from spans_all").fetchall()[0][0]
            finally:
                con.close()
            if count >= expected:
                return
        time.sleep(0.3)
    raise AssertionError(f"only {count} of {expected} spans converted within {timeout} s")


def _stop_traced(proc: subprocess.Popen) -> None:
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    assert children, "strace has no traced child"
    os.kill(int(children[0]), signal.SIGTERM)
    proc.wait(60)


def test_e39_every_200_follows_the_fsync_of_its_segment(tmp_path):
    tmp_path = tmp_path.resolve()
    proc, port, trace = _start_traced(tmp_path)
    markers: dict[int, list[str]] = {}
    statuses: list[int] = []
    try:
        threads = [threading.Thread(target=_client, args=(port, i, markers, statuses)) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert statuses == [200] * (CLIENTS * REQUESTS_PER_CLIENT)
        _wait_stored(tmp_path / "data", CLIENTS * REQUESTS_PER_CLIENT, 40)
    finally:
        _stop_traced(proc)
    calls = parse_strace(trace.read_text())
    spool_dir = str((tmp_path / "data" / "spool").resolve())
    assert any(c.name.startswith("rename") and ".parquet" in c.args for c in calls), "no Parquet rename traced"
    assert audit(calls, markers, spool_dir) == []
