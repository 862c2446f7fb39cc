"""The vendored JavaScript is the published npm files, unchanged (their hashes are in vendor/README.md)."""

import hashlib
import re
from pathlib import Path

VENDOR = Path(__file__).resolve().parents[2] / "pipeline" / "serve" / "static" / "vendor"


def test_vendored_files_match_the_published_hashes():
    pinned = dict(re.findall(r"^\| (\S+\.js) \| ([0-9a-f]{64}) \|$", (VENDOR / "README.md").read_text(), re.M))
    assert set(pinned) == {p.name for p in VENDOR.glob("*.js")} == {"cytoscape.min.js", "cytoscape-dagre.min.js"}
    for name, digest in pinned.items():
        assert hashlib.sha256((VENDOR / name).read_bytes()).hexdigest() == digest, name
