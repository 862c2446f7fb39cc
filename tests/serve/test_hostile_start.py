"""#28 and #29 at start: a busy --port, a token no client can send, spill directories of dead servers."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.serve.serve_support import running_server

SERVE = [sys.executable, "-c", "from tracedag.pipeline.cli import cli; cli()", "serve"]


def test_a_busy_port_is_one_line_naming_port_and_exit_1(serve_store: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run([*SERVE, "--data", str(serve_store), "--port", str(port)], capture_output=True,
                           text=True, timeout=60)
    out = (r.stdout + r.stderr).strip()
    assert r.returncode == 1, (r.returncode, out)
    assert len(out.splitlines()) == 1 and "--port" in out and str(port) in out, out
    assert "Traceback" not in out and "http://" not in out


@pytest.mark.parametrize("token", ["tökenтокен-1234567890", "token with spaces 1234", "tab\tseparated-token-123"])
def test_a_token_no_client_can_send_is_refused_at_start(serve_store: Path, tmp_path: Path, token: str) -> None:
    path = tmp_path / "token"
    path.write_text(token + "\n")
    r = subprocess.run([*SERVE, "--data", str(serve_store), "--port", "0", "--token-file", str(path)],
                       capture_output=True, text=True, timeout=60)
    out = (r.stdout + r.stderr).strip()
    assert r.returncode != 0 and str(path) in out and "ASCII" in out, out
    assert "Traceback" not in out and "http://" not in out


def test_spill_directories_of_dead_servers_are_removed_at_start(serve_store: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    temp = tmp_path / "tmp"
    dead = temp / "tracedag-sql-999999999-abc"  # above any pid_max: no such process
    alive = temp / f"tracedag-sql-{os.getpid()}-def"
    other = temp / "unrelated-999999999-x"
    for d in (dead, alive, other):
        d.mkdir(parents=True)
        (d / "duckdb_temp_block-1.block").write_bytes(b"\0" * 4096)
    monkeypatch.setenv("TMPDIR", str(temp))
    with running_server(serve_store):
        assert not dead.exists()
        assert alive.exists() and other.exists()
