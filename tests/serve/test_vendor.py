"""The vendored JavaScript is the published npm files, unchanged (their hashes are in vendor/README.md),
stored gzipped and served as published."""

import gzip
import hashlib
import re
from pathlib import Path

from starlette.testclient import TestClient

from tracedag.pipeline.serve.app import create_app

VENDOR = Path(__file__).resolve().parents[2] / "pipeline" / "serve" / "static" / "vendor"


def _pinned() -> dict[str, str]:
    return dict(re.findall(r"^\| (\S+\.js) \| ([0-9a-f]{64}) \|$", (VENDOR / "README.md").read_text(), re.M))


def test_vendored_files_match_the_published_hashes():
    pinned = _pinned()
    assert set(pinned) == {p.name.removesuffix(".gz") for p in VENDOR.glob("*.js.gz")} == {
        "cytoscape.min.js", "cytoscape-dagre.min.js"}
    assert not list(VENDOR.glob("*.js"))  # only the compressed copies are kept
    for name, digest in pinned.items():
        assert hashlib.sha256(gzip.decompress((VENDOR / f"{name}.gz").read_bytes())).hexdigest() == digest, name


def test_the_server_sends_the_published_bytes(serve_store):
    pinned = _pinned()
    with TestClient(create_app(serve_store, warm=False)) as client:
        for name, digest in pinned.items():
            plain = client.get(f"/static/vendor/{name}", headers={"Accept-Encoding": "identity"})
            assert plain.status_code == 200 and "javascript" in plain.headers["content-type"]
            assert "content-encoding" not in plain.headers
            assert hashlib.sha256(plain.content).hexdigest() == digest, name
            zipped = client.get(f"/static/vendor/{name}", headers={"Accept-Encoding": "gzip"})
            assert zipped.headers["content-encoding"] == "gzip"  # the client decoded it
            assert hashlib.sha256(zipped.content).hexdigest() == digest, name
        assert client.get("/static/vendor/other.js").status_code == 404
