"""G58 HTTP/2 and gRPC abuse: the grpcio release is past the CVE-2023-44487 (Rapid Reset) fixes, the
server advertises SETTINGS_MAX_CONCURRENT_STREAMS, answers a ping flood with GOAWAY
(keepalive enforcement), and stays responsive during a bounded rapid-reset loop.

The HTTP/2 frames are written by hand on a raw socket (no HTTP/2 library is installed): the
connection preface, SETTINGS, PING, HEADERS (HPACK literals without indexing) and RST_STREAM.
"""

from __future__ import annotations

import re
import select
import socket
import struct
import time
from importlib.metadata import version
from pathlib import Path

import grpc
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.sdk.trace.export import SpanExportResult

from tests.collector.test_exporters import _finished_spans
from tracedag.collector.otlp_grpc import GrpcSettings, server_options

# CVE-2023-44487 in gRPC core (which grpcio wraps): the chttp2 rollup of Rapid Reset fixes
# (grpc/grpc#34763, with #34637/#34639/#34640) shipped in 1.60.0; NVD lists gRPC core up to and
# including 1.59.2 as affected. So the floor is 1.60.0, for the installed wheel and the declared range.
RAPID_RESET_FIXED = (1, 60, 0)
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SETTINGS, PING, GOAWAY, HEADERS, RST_STREAM = 0x4, 0x6, 0x7, 0x1, 0x3
MAX_CONCURRENT_STREAMS = 0x3
ENHANCE_YOUR_CALM = 0xB
EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def test_g58_grpcio_at_or_above_the_rapid_reset_fix():
    assert _version_tuple(version("grpcio")) >= RAPID_RESET_FIXED
    assert _version_tuple(grpc.__version__) >= RAPID_RESET_FIXED
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    floor = re.search(r'"grpcio>=([\d.]+)"', pyproject)
    assert floor and _version_tuple(floor.group(1)) >= RAPID_RESET_FIXED, "pyproject allows a vulnerable grpcio"


def test_g58_server_options_cap_streams_and_enforce_keepalive():
    options = dict(server_options(GrpcSettings()))
    assert 0 < options["grpc.max_concurrent_streams"] <= 1000
    assert options["grpc.http2.min_ping_interval_without_data_ms"] >= 5000
    assert 0 < options["grpc.http2.max_ping_strikes"] <= 5
    assert options["grpc.keepalive_permit_without_calls"] == 0


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _read_frame(sock: socket.socket) -> tuple[int, int, bytes]:
    head = _recv_exactly(sock, 9)
    length = int.from_bytes(head[:3], "big")
    return head[3], head[4], _recv_exactly(sock, length)


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def _open_h2(port: int) -> tuple[socket.socket, dict[int, int]]:
    """Connect, exchange SETTINGS, and return the socket with the server's settings."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(PREFACE + _frame(SETTINGS, 0, 0))
    while True:
        kind, flags, payload = _read_frame(sock)
        if kind == SETTINGS and not flags & 1:
            settings = {struct.unpack(">H", payload[i:i + 2])[0]: struct.unpack(">I", payload[i + 2:i + 6])[0]
                        for i in range(0, len(payload), 6)}
            sock.sendall(_frame(SETTINGS, 1, 0))  # ACK
            return sock, settings


def test_g58_max_concurrent_streams_advertised(collector):
    sock, settings = _open_h2(collector.grpc_port)
    sock.close()
    assert settings.get(MAX_CONCURRENT_STREAMS) == GrpcSettings().max_concurrent_streams


def test_g58_ping_flood_gets_goaway_too_many_pings(collector):
    sock, _ = _open_h2(collector.grpc_port)
    sock.settimeout(20)  # a loaded machine (the whole suite on 2 cores) may answer late
    frames: list[int] = []
    goaway = None
    try:
        for i in range(50):  # spaced, and frames read as they come: no unread data when the server closes
            sock.sendall(_frame(PING, 0, 0, struct.pack(">Q", i)))
            goaway = _read_available(sock, frames) or goaway
            if goaway is not None:
                break
            time.sleep(0.01)
        deadline = time.monotonic() + 20
        while goaway is None and time.monotonic() < deadline:
            kind, _, payload = _read_frame(sock)
            frames.append(kind)
            if kind == GOAWAY:
                goaway = payload
    except (ConnectionError, OSError):
        pass
    finally:
        sock.close()
    assert goaway is not None, f"no GOAWAY after a ping flood (frame types read: {frames})"
    assert struct.unpack(">I", goaway[4:8])[0] == ENHANCE_YOUR_CALM and b"too_many_pings" in goaway[8:]


def _read_available(sock: socket.socket, frames: list[int]) -> bytes | None:
    """Read the frames already waiting; return a GOAWAY's payload if one came."""
    while select.select([sock], [], [], 0)[0]:
        kind, _, payload = _read_frame(sock)
        frames.append(kind)
        if kind == GOAWAY:
            return payload
    return None


def _hpack_literal(name: str, value: str) -> bytes:
    """One header as an HPACK literal without indexing, new name, no Huffman (lengths < 127)."""
    return b"\x00" + bytes([len(name)]) + name.encode() + bytes([len(value)]) + value.encode()


def _rapid_resets(port: int, streams: int) -> int:
    """Open and cancel ``streams`` streams at once; return how many were sent before the server closed."""
    sock, _ = _open_h2(port)
    block = b"".join(_hpack_literal(k, v) for k, v in (
        (":method", "POST"), (":scheme", "http"), (":path", EXPORT), (":authority", f"127.0.0.1:{port}"),
        ("content-type", "application/grpc"), ("te", "trailers")))
    sent = 0
    try:
        for start in range(0, streams, 500):
            burst = b"".join(_frame(HEADERS, 0x4, 2 * i + 1, block) + _frame(RST_STREAM, 0, 2 * i + 1, b"\0\0\0\x08")
                             for i in range(start, min(start + 500, streams)))
            sock.sendall(burst)
            sent = min(start + 500, streams)
    except OSError:
        pass
    finally:
        sock.close()
    return sent


def test_g58_rapid_reset_loop_server_stays_responsive(collector):
    started = time.monotonic()
    sent = _rapid_resets(collector.grpc_port, 10_000)
    assert sent > 0 and time.monotonic() - started < 30
    began = time.monotonic()
    exporter = GrpcExporter(endpoint=f"127.0.0.1:{collector.grpc_port}", insecure=True, timeout=5)
    assert exporter.export(_finished_spans(2, "after-reset")) == SpanExportResult.SUCCESS
    assert time.monotonic() - began < 1.0
