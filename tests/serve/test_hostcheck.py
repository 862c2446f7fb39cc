"""Without a token, ``tracedag serve`` answers only as its own Host names and refuses cross-site writes
(#29 item 8: DNS rebinding and cross-site ``text/plain`` POSTs), on a real server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.serve.serve_support import Server, running_server
from tracedag.pipeline.serve.hostcheck import HostPolicy


@pytest.fixture(scope="module")
def server(serve_store: Path) -> Iterator[Server]:
    with running_server(serve_store, "--allowed-host", "tracedag.internal") as s:
        yield s


def _port(server: Server) -> int:
    return int(server.url.rsplit(":", 1)[1])


def test_only_the_names_it_listens_as_are_answered(server: Server) -> None:
    c, port = server.client(), _port(server)
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", f"LOCALHOST:{port}",
                 f"tracedag.internal:{port}"):
        assert c.get("/api/traces", params={"limit": 1}, headers={"Host": host}).status_code == 200, host
    for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1:{port + 1}", "localhost",
                 f"tracedag.internal:{port + 1}", f"localhost.evil.example:{port}"):
        r = c.get("/api/traces", params={"limit": 1}, headers={"Host": host})
        assert r.status_code == 421 and "--allowed-host" in r.json()["error"], (host, r.status_code)
    assert c.get("/healthz", headers={"Host": f"rebound.evil.example:{port}"}).status_code == 421


def test_cross_site_writes_are_refused_and_scripts_still_post(server: Server) -> None:
    c, port = server.client(), _port(server)
    refused = [
        ({"Content-Type": "text/plain"}, "select 1 as n"),
        ({"Content-Type": "application/x-www-form-urlencoded"}, "sql=select+1"),
        ({"Content-Type": "multipart/form-data; boundary=x"}, "--x--"),
        ({"Content-Type": "application/json", "Origin": "http://evil.example"}, '{"sql": "select 1 as n"}'),
        ({"Origin": "http://evil.example"}, "select 1 as n"),
        ({"Content-Type": "application/json", "Origin": "null"}, '{"sql": "select 1 as n"}'),
        ({"Content-Type": "application/json", "Origin": f"http://127.0.0.1:{port + 1}"}, '{"sql": "select 1 as n"}'),
    ]
    for headers, body in refused:
        r = c.post("/api/sql", content=body, headers=headers)
        assert r.status_code == 403, (headers, r.status_code, r.text[:200])
    accepted = [
        {"Content-Type": "application/json"},
        {"Content-Type": "application/json; charset=utf-8", "Origin": f"http://127.0.0.1:{port}"},
        {"Content-Type": "application/json", "Origin": f"http://localhost:{port}"},
    ]
    for headers in accepted:
        r = c.post("/api/sql", content='{"sql": "select 1 as n"}', headers=headers)
        assert r.status_code == 200 and r.json()["rows"] == [{"n": 1}], (headers, r.text[:200])
    raw = c.post("/api/sql", content="select 2 as n")  # a script: no Content-Type, no Origin
    assert raw.status_code == 200 and raw.json()["rows"] == [{"n": 2}]


def test_with_a_token_the_host_is_not_checked(serve_store: Path, tmp_path: Path) -> None:
    token = "t" * 32
    with running_server(serve_store, token=token, tmp=tmp_path) as s:
        r = s.client().get("/api/traces", params={"limit": 1}, headers={"Host": "tracedag.example.com"})
        assert r.status_code == 200


def test_the_policy_parses_names_ports_and_origins() -> None:
    p = HostPolicy(8080, ("box.lan", "proxy:9000"))
    assert p.allows("box.lan:8080") and p.allows("proxy:9000") and not p.allows("proxy:8080")
    assert not p.allows("127.0.0.1:80") and not p.allows("127.0.0.1:x") and not p.allows("[::1]")
    assert p.allows_origin("http://localhost:8080") and not p.allows_origin("http://localhost")
    assert not p.allows_origin("http://localhost:8080/path") and not p.allows_origin("file://")
    assert HostPolicy(80).allows_origin("http://localhost") and HostPolicy(0).allows("localhost:1234")
