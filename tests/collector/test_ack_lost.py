"""E41 ack lost in transit: a loopback proxy drops the client's connection after the collector's 200.

What the real HTTP exporter 1.45.2 does (read in site-packages): its urllib3 transport uses
``Retry(0)``, so a connection closed before the response raises ``ProtocolError``
(``RemoteDisconnected``/``ConnectionResetError``), which ``is_connection_error`` classes as a
connection error; ``_OTLPHTTPClient._submit`` then resends the same bytes at once, without
backoff (it treats it as a stale pooled connection), and further failures go through the
exponential-backoff loop. So the batch reaches the collector twice, both times acknowledged,
and the store must de-duplicate on (trace_id, span_id).
"""

from __future__ import annotations

import socket
import struct
import threading
from dataclasses import dataclass, field

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.trace.export import SpanExportResult

from tests.collector.test_exporters import _finished_spans
from tracedag.pipeline.store.views import connect


def _read_message(sock: socket.socket) -> bytes:
    """Read one HTTP/1.1 message (head + Content-Length body); b"" when the peer closed first."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            return b""
        body += chunk
    return head + b"\r\n\r\n" + body


@dataclass
class AckDroppingProxy:
    """Forwards HTTP/1.1 exchanges to ``upstream``; the first response is swallowed and the client reset."""

    upstream: int
    requests: list[bytes] = field(default_factory=list)
    responses: list[bytes] = field(default_factory=list)
    dropped: int = 0

    def start(self) -> int:
        """Listen on a free loopback port in a daemon thread and return it."""
        self._listener = socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=self._accept, daemon=True).start()
        return int(self._listener.getsockname()[1])

    def close(self) -> None:
        """Stop listening."""
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with client, socket.create_connection(("127.0.0.1", self.upstream)) as up:
            while True:
                request = _read_message(client)
                if not request:
                    return
                self.requests.append(request)
                up.sendall(request)
                response = _read_message(up)
                self.responses.append(response)
                if self.dropped == 0:
                    self.dropped += 1
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return  # reset: the collector's 200 never reaches the client
                client.sendall(response)


def test_e41_ack_lost_in_transit_resent_and_stored_once(collector):
    proxy = AckDroppingProxy(collector.http_port)
    port = proxy.start()
    try:
        spans = _finished_spans(3, "ack-lost")
        exporter = HttpExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces", timeout=10)
        assert exporter.export(spans) == SpanExportResult.SUCCESS
    finally:
        proxy.close()
    assert proxy.dropped == 1
    assert len(proxy.requests) == 2, "the exporter resends once, at once, after the reset"
    assert [r.split(b"\r\n", 1)[0] for r in proxy.responses] == [b"HTTP/1.1 200 OK"] * 2  # both persisted
    assert proxy.requests[0].partition(b"\r\n\r\n")[2] == proxy.requests[1].partition(b"\r\n\r\n")[2]
    collector.flush()
    con = connect(collector.data)
    rows = con.execute("select span_id, count(*) from spans group by span_id").fetchall()
    assert sorted(rows) == sorted((format(s.context.span_id, "016x"), 1) for s in spans)
