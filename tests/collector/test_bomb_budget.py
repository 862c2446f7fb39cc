"""Issue #29 item 12: concurrent gzip bombs stay within the collector's in-flight budget.

32 clients each send about 1 MB of gzip that inflates to 1 GiB of zeros, at once, to a real
``tracedag collect`` process (default limits: 64 MiB per request, 128 MiB in flight). Its
resident memory, sampled from /proc, must stay under the budget plus a fixed overhead: before
the fix every worker thread inflated up to 64 MiB outside the budget (1.3 GB over HTTP here).
Every bomb is refused (413 over the limit, 503/UNAVAILABLE when the shared budget is spent),
and legitimate requests sent afterwards are acknowledged and stored exactly once.

The gRPC bombs are real compressed messages (flag 1, ``grpc-encoding: gzip``), sent by
``H2Sender`` below: the grpc client would have to compress 1 GiB itself for each one.
"""

from __future__ import annotations

import gzip
import hashlib
import re
import socket
import struct
import threading
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.collector.collector_support import (
    make_request,
    make_span,
    post,
    rss_bytes,
    start_process,
    stop_process,
)
from tests.fuzzing import examples
from tracedag.pipeline.store.views import connect

BOMBS = 32
BOMB_BYTES = 1 << 30
BUDGET = 128 * 2**20  # the --max-inflight default
OVERHEAD = 250 * 10**6  # interpreter, grpc, spool, reader buffers, one inflate step per worker
EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
T = TypeVar("T")


def gzip_bomb(size: int = BOMB_BYTES) -> bytes:
    """About size/1000 bytes of gzip inflating to ``size`` zero bytes (``size`` a multiple of 1 MiB).

    One MiB of zeros is deflated once, ending on a full flush (its blocks refer to nothing before
    them), and repeated: compressing the whole GiB took ~6 s of CPU, this ~0.3 s. Gzip header,
    a final empty block and the trailer (CRC-32 and size of the inflated bytes) around it.
    """
    block = bytes(1 << 20)
    packer = zlib.compressobj(9, zlib.DEFLATED, -15)  # raw deflate
    piece = packer.compress(block) + packer.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(size >> 20):
        crc = zlib.crc32(block, crc)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"  # gzip, deflate, no name, no time, best, unknown OS
    final = b"\x03\x00"  # an empty fixed-Huffman block with BFINAL set
    return header + piece * (size >> 20) + final + struct.pack("<II", crc, size & 0xFFFFFFFF)


def test_the_bomb_is_gzip_of_zeros_at_about_a_thousand_to_one() -> None:
    small = gzip_bomb(8 << 20)
    assert gzip.decompress(small) == bytes(8 << 20)  # checks the trailer's CRC and size too
    assert len(small) < (8 << 20) // 1000


class PeakRss:
    """Peak resident memory of one process, sampled every 5 ms from /proc."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, rss_bytes(self.pid))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def peak_during(pid: int, action: Callable[[], T]) -> tuple[int, T]:
    """Run ``action`` while sampling ``pid``; return (peak RSS, what it returned)."""
    sampler = PeakRss(pid)
    try:
        result = action()
    finally:
        peak = sampler.stop()
    return peak, result


def post_bomb(port: int, bomb: bytes) -> int:
    return post(port, bomb, headers={"Content-Encoding": "gzip"}, timeout=120).status


def _hpack_literal(name: str, value: str) -> bytes:
    """One header as an HPACK literal without indexing, no Huffman (names and values under 127 bytes)."""
    n, v = name.encode(), value.encode()
    return b"\x00" + bytes([len(n)]) + n + bytes([len(v)]) + v


class H2Sender:
    """Just enough HTTP/2 to send one gRPC message as given (already compressed, flag set).

    Flow control is honoured (SETTINGS, WINDOW_UPDATE, PING acks); the answer's headers are
    not decoded (HPACK): the outcome is read from the collector's /metrics instead.
    """

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=120)
        self.conn_window = self.stream_window = self.initial_window = 65535
        self.max_frame = 16384
        self.ended = False
        self.sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + self._frame(4, 0, 0, b""))

    @staticmethod
    def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload

    def _read_exact(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            got = self.sock.recv(n - len(out))
            if not got:
                raise ConnectionError("closed")
            out += got
        return out

    def _read_frame(self) -> None:
        head = self._read_exact(9)
        length, kind, flags = int.from_bytes(head[:3], "big"), head[3], head[4]
        payload = self._read_exact(length)
        if kind == 4 and not flags & 1:  # SETTINGS: adopt, then ack
            for i in range(0, len(payload), 6):
                key, value = struct.unpack(">HI", payload[i : i + 6])
                if key == 4:
                    self.stream_window += value - self.initial_window
                    self.initial_window = value
                elif key == 5:
                    self.max_frame = value
            self.sock.sendall(self._frame(4, 1, 0, b""))
        elif kind == 8:  # WINDOW_UPDATE
            inc = struct.unpack(">I", payload)[0] & 0x7FFFFFFF
            stream = struct.unpack(">I", head[5:9])[0] & 0x7FFFFFFF
            if stream == 0:
                self.conn_window += inc
            else:
                self.stream_window += inc
        elif kind == 6 and not flags & 1:  # PING: ack
            self.sock.sendall(self._frame(6, 1, 0, payload))
        elif kind in (3, 7) or (kind == 1 and flags & 1):  # RST_STREAM, GOAWAY, HEADERS with END_STREAM
            self.ended = True

    def send(self, message: bytes, encoding: str = "gzip") -> None:
        """Send ``message`` as one compressed gRPC request and wait for the end of the answer."""
        headers = b"".join(_hpack_literal(k, v) for k, v in (
            (":method", "POST"), (":scheme", "http"), (":path", EXPORT), (":authority", "localhost"),
            ("content-type", "application/grpc"), ("te", "trailers"), ("grpc-encoding", encoding)))
        self.sock.sendall(self._frame(1, 4, 1, headers))
        data = b"\x01" + struct.pack(">I", len(message)) + message
        while data and not self.ended:
            room = min(self.conn_window, self.stream_window, self.max_frame)
            if room <= 0:
                self._read_frame()
                continue
            piece, data = data[:room], data[room:]
            self.conn_window -= len(piece)
            self.stream_window -= len(piece)
            self.sock.sendall(self._frame(0, 0 if data else 1, 1, piece))
        while not self.ended:
            self._read_frame()

    def close(self) -> None:
        self.sock.close()


def send_grpc_bomb(port: int, bomb: bytes) -> None:
    sender = H2Sender(port)
    try:
        sender.send(bomb)
    finally:
        sender.close()


def grpc_statuses(http_port: int) -> dict[str, int]:
    """tracedag_requests_total{transport="grpc"} by status, from /metrics."""
    text = post(http_port, b"", None, path="/metrics", method="GET").body.decode()
    found = re.findall(r'tracedag_requests_total\{transport="grpc",status="(\w+)"\} ([\d.]+)', text)
    return {status: int(float(n)) for status, n in found}


@pytest.fixture(scope="module")
def bomb() -> bytes:
    return gzip_bomb()


def _pad(size: int) -> str:
    """Deterministic text of ``size`` characters, to compare byte for byte once stored."""
    return "".join(chr(97 + (j * 7919) % 26) for j in range(size))


def _legit_body(i: int, pad: int = 0) -> bytes:
    span = make_span(i, name=f"legit-{i}")
    if pad:
        kv = span.attributes.add()
        kv.key, kv.value.string_value = "pad", _pad(pad)
    return make_request([span]).SerializeToString()


def _stored_names(data) -> list[str]:
    return [name for (name,) in connect(data).execute("select name from spans order by name").fetchall()]


def test_32_http_gzip_bombs_stay_within_the_inflight_budget(tmp_path, bomb):
    proc, http_port, _ = start_process(tmp_path, env={"TRACEDAG_CONVERTERS": "1"})
    try:
        time.sleep(0.5)
        idle = rss_bytes(proc.pid)
        with ThreadPoolExecutor(BOMBS) as pool:
            peak, statuses = peak_during(proc.pid, lambda: list(pool.map(lambda _: post_bomb(http_port, bomb),
                                                                             range(BOMBS))))
        assert set(statuses) <= {413, 503}, statuses
        growth = peak - idle
        assert growth < BUDGET + OVERHEAD, f"collector grew {growth / 2**20:.0f} MiB under {BOMBS} bombs"
        assert post_bomb(http_port, bomb) == 413  # alone, a bomb reaches the per-request limit
        # afterwards: plain and gzip (inflated in several steps, 3 MiB) requests are acknowledged
        assert post(http_port, _legit_body(1)).status == 200
        big = gzip.compress(_legit_body(2, pad=3 * 2**20))
        assert post(http_port, big, headers={"Content-Encoding": "gzip"}).status == 200
    finally:
        assert stop_process(proc) == 0
    assert _stored_names(tmp_path) == ["legit-1", "legit-2"]  # each once, nothing of the bombs


def _real_exporter_spans(n: int):
    memory = InMemorySpanExporter()
    tp = TracerProvider(resource=Resource.create({"service.name": "after-bombs"}))
    tp.add_span_processor(SimpleSpanProcessor(memory))
    for i in range(n):
        with tp.get_tracer("t").start_as_current_span(f"legit-grpc-{i}"):
            pass
    return list(memory.get_finished_spans())


def test_32_grpc_gzip_bombs_stay_within_the_inflight_budget(tmp_path, bomb):
    proc, http_port, grpc_port = start_process(tmp_path, env={"TRACEDAG_CONVERTERS": "1"})
    try:
        time.sleep(0.5)
        idle = rss_bytes(proc.pid)
        with ThreadPoolExecutor(BOMBS) as pool:
            peak, _ = peak_during(proc.pid, lambda: list(pool.map(lambda _: send_grpc_bomb(grpc_port, bomb),
                                                                  range(BOMBS))))
        growth = peak - idle
        assert growth < BUDGET + OVERHEAD, f"collector grew {growth / 2**20:.0f} MiB under {BOMBS} bombs"
        statuses = grpc_statuses(http_port)
        assert sum(statuses.values()) == BOMBS and set(statuses) <= {"RESOURCE_EXHAUSTED", "UNAVAILABLE"}, statuses
        send_grpc_bomb(grpc_port, bomb)  # alone, a bomb reaches the per-message limit
        assert grpc_statuses(http_port).get("RESOURCE_EXHAUSTED", 0) == statuses.get("RESOURCE_EXHAUSTED", 0) + 1
        spans = _real_exporter_spans(3)
        exporter = GrpcExporter(endpoint=f"127.0.0.1:{grpc_port}", insecure=True, compression=grpc.Compression.Gzip)
        assert exporter.export(spans) == SpanExportResult.SUCCESS
    finally:
        assert stop_process(proc) == 0
    assert _stored_names(tmp_path) == ["legit-grpc-0", "legit-grpc-1", "legit-grpc-2"]


@pytest.mark.parametrize("compression", [grpc.Compression.Gzip, grpc.Compression.Deflate])
def test_compressed_grpc_messages_inflated_in_steps_are_stored_intact(collector, compression):
    """grpc core no longer inflates: gzip and deflate messages of several inflate steps arrive whole."""
    body = _legit_body(7, pad=3 * 2**20)
    with grpc.insecure_channel(f"127.0.0.1:{collector.grpc_port}",
                               options=[("grpc.max_send_message_length", 64 * 2**20)]) as channel:
        channel.unary_unary(EXPORT)(body, timeout=30, compression=compression)
        with pytest.raises(grpc.RpcError) as err:  # gzip inside the compressed message: inflated once only
            channel.unary_unary(EXPORT)(gzip.compress(body), timeout=30, compression=compression)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    collector.flush()
    pad = _pad(3 * 2**20)
    rows = connect(collector.data).execute("select md5(attributes['pad']) from spans where name = 'legit-7'").fetchall()
    assert rows == [(hashlib.md5(pad.encode()).hexdigest(),)]  # once, byte for byte


@settings(max_examples=examples(300), deadline=None)
@given(data=st.binary(max_size=20000) | st.integers(0, 200000).map(bytes), chunk=st.sampled_from([1, 7, 4096]),
       cuts=st.lists(st.integers(1, 3000), max_size=20), level=st.sampled_from([1, 9]))
def test_inflating_in_steps_gives_back_the_body_exactly(data, chunk, cuts, level):
    """Any body, any step size, any split of the gzip stream: the same bytes (also when a full step leaves
    output pending in zlib with no input left), each step passed to ``reserve``."""
    import tracedag.collector.http_wire as wire

    compressed = gzip.compress(data, compresslevel=level)
    reserved: list[int] = []
    old, wire.INFLATE_CHUNK = wire.INFLATE_CHUNK, chunk
    try:
        sink = wire.BodySink(len(data), True, reserved.append)
        pos = 0
        for cut in [*cuts, len(compressed)]:
            sink.feed(compressed[pos : pos + cut])
            pos += cut
        assert sink.finish() == data
        assert sum(reserved) == len(data) and max(reserved, default=0) <= chunk
        if data:  # one byte under the body: 413, whatever the step
            over = wire.BodySink(len(data) - 1, True, reserved.append)
            with pytest.raises(wire.HttpError) as err:
                over.feed(compressed)
                over.finish()
            assert err.value.status == 413
    finally:
        wire.INFLATE_CHUNK = old
