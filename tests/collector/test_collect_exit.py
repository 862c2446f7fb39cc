"""``tracedag collect`` as a user starts and stops it: a port in use leaves nothing behind, and Ctrl-C
with an exporter still connected ends quietly (no asyncio traceback)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from tests.collector.collector_support import start_process

CLI = [sys.executable, "-c", "from tracedag.pipeline.cli import cli; cli()"]


def _files(root):
    return sorted(os.path.join(d, n) for d, dirs, files in os.walk(root) for n in (*dirs, *files))


@pytest.mark.parametrize(("option", "other"), [("--http-port", "--grpc-port"), ("--grpc-port", "--http-port")])
@pytest.mark.parametrize("existing", [False, True])
def test_a_busy_port_creates_nothing_and_names_the_port_and_option(tmp_path, option, other, existing):
    data = tmp_path / "data"
    if existing:  # a store a collector ran on before: not one file more, none less
        proc, _, _ = start_process(data)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    before = _files(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        res = subprocess.run([*CLI, "collect", "--data", str(data), option, str(port), other, "0"],
                             capture_output=True, text=True, timeout=60)
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"port {port} on 127.0.0.1 is not available" in res.stderr and option in res.stderr
    assert "Traceback" not in res.stderr
    assert _files(tmp_path) == before  # no data directory, no spool or lock files


def _exporter(protocol, http_port, grpc_port):
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc

        return Grpc(endpoint=f"127.0.0.1:{grpc_port}", insecure=True)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http

    return Http(endpoint=f"http://127.0.0.1:{http_port}/v1/traces")


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_ctrl_c_with_an_exporter_connected_prints_no_traceback(tmp_path, protocol):
    """The exporter sent a span and keeps its connection open (an HTTP keep-alive connection, a gRPC
    channel) when the user presses Ctrl-C: the collector drains, stops, exits 0, stderr stays empty."""
    proc, http_port, grpc_port = start_process(tmp_path / "data")
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(_exporter(protocol, http_port, grpc_port)))
    try:
        with provider.get_tracer("t").start_as_current_span("connected"):
            pass
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        provider.shutdown()
    assert proc.returncode == 0, out + err
    assert "tracedag collect: stopped" in out
    assert "Traceback" not in err and "asyncio" not in err, err
