"""One collector per data directory; a port in use is one line, not a traceback."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading

import pytest

from tests.collector.collector_support import (
    PB,
    make_request,
    make_span,
    post,
    start_process,
    stop_process,
    stored,
)
from tracedag.collector.server import PortUnavailable
from tracedag.collector.storelock import StoreInUse
from tracedag.pipeline.service import CollectorConfig, start_collector


def _collect(data, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-c", "from tracedag.pipeline.cli import cli; cli()", "collect", "--data", str(data), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def test_second_collector_on_the_same_store_refuses_and_the_first_loses_nothing(tmp_path):
    data = tmp_path / "data"
    first, http_port, grpc_port = start_process(data)
    acked: list[int] = []
    stop = threading.Event()

    def send() -> None:  # the first collector is busy acking while the second one tries to start
        i = 0
        while not stop.is_set():
            body = make_request([make_span(i * 10 + k, trace=(i + 1).to_bytes(16, "big")) for k in range(10)])
            if post(http_port, body.SerializeToString(), PB).status == 200:
                acked.append(10)
            i += 1

    sender = threading.Thread(target=send)
    sender.start()
    try:
        second = _collect(data, "--http-port", "0", "--grpc-port", "0")
        assert second.returncode != 0
        assert "Traceback" not in second.stderr
        message = second.stderr.strip().splitlines()[-1]
        assert f"pid {first.pid}" in message and str(http_port) in message and str(grpc_port) in message, message
        assert "--data" in message
    finally:
        stop.set()
        sender.join(30)
        assert stop_process(first) == 0
    assert acked and len(stored(data)) == sum(acked)
    assert "could not seal" not in first.stderr.read()


def test_the_lock_of_a_killed_collector_is_taken_over(tmp_path):
    data = tmp_path / "data"
    first, http_port, _ = start_process(data)
    assert post(http_port, make_request([make_span(i) for i in range(3)]).SerializeToString(), PB).status == 200
    first.send_signal(signal.SIGKILL)
    first.wait(30)
    holder = json.loads((data / "state" / "collector.lock").read_text())
    assert holder["pid"] == first.pid and holder["http_port"] == http_port
    second, http2, _ = start_process(data)
    try:
        assert json.loads((data / "state" / "collector.lock").read_text())["pid"] == second.pid
        assert post(http2, make_request([make_span(7)]).SerializeToString(), PB).status == 200
    finally:
        assert stop_process(second) == 0
    assert len(stored(data)) == 4  # the killed collector's acked spans were recovered


def test_in_process_lock_is_released_on_stop(tmp_path):
    data = tmp_path / "data"
    first = start_collector(CollectorConfig(data=data, http_port=0, grpc_port=0))
    try:
        with pytest.raises(StoreInUse, match=f"OTLP/HTTP port {first.http_port}"):
            start_collector(CollectorConfig(data=data, http_port=0, grpc_port=0))
    finally:
        first.stop(2)
    start_collector(CollectorConfig(data=data, http_port=0, grpc_port=0)).stop(2)


@pytest.mark.parametrize("option", ["--http-port", "--grpc-port"])
def test_port_in_use_is_one_line_naming_the_option(tmp_path, option):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        other = "--grpc-port" if option == "--http-port" else "--http-port"
        result = _collect(tmp_path / "data", option, str(port), other, "0")
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    assert f"port {port}" in lines[0] and "already in use" in lines[0] and option in lines[0]
    # nothing was left holding the store: a collector starts on it at once
    c = start_collector(CollectorConfig(data=tmp_path / "data", http_port=0, grpc_port=0))
    c.stop(2)


def test_port_in_use_in_process_releases_everything(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(PortUnavailable, match="--grpc-port"):
            start_collector(CollectorConfig(data=tmp_path / "data", http_port=0, grpc_port=taken.getsockname()[1]))
    start_collector(CollectorConfig(data=tmp_path / "data", http_port=0, grpc_port=0)).stop(2)
