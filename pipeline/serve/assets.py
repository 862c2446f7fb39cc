"""The web UI's vendored JavaScript, stored gzipped (``static/vendor/<name>.gz``) and served as the
published file: with ``Content-Encoding: gzip`` to a browser that accepts it, decompressed otherwise.

The compressed files hold the npm packages' bytes unchanged (``tests/serve/test_vendor.py`` checks the
SHA-256 of the decompressed content against ``static/vendor/README.md``); keeping them compressed also
keeps a third party's minified source out of the searches over this project's own text.
"""

from __future__ import annotations

import gzip
from pathlib import Path

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

VENDOR = Path(__file__).parent / "static" / "vendor"
SCRIPTS = ("cytoscape.min.js", "cytoscape-dagre.min.js")


def vendor_gz(name: str) -> bytes:
    """The gzipped bytes of the vendored script ``name`` (one of ``SCRIPTS``)."""
    return (VENDOR / f"{name}.gz").read_bytes()


def vendor_text(name: str) -> str:
    """The vendored script ``name`` as published (the report inlines it)."""
    return gzip.decompress(vendor_gz(name)).decode("utf-8")


async def vendor_script(request: Request) -> Response:
    """``GET /static/vendor/{name}``: a vendored script; 404 for any other name."""
    name = request.path_params["name"]
    if name not in SCRIPTS:
        return PlainTextResponse("not found", status_code=404)
    headers = {"Cache-Control": "public, max-age=86400", "Vary": "Accept-Encoding"}
    media = "text/javascript; charset=utf-8"
    if "gzip" in request.headers.get("accept-encoding", ""):
        return Response(vendor_gz(name), media_type=media, headers={**headers, "Content-Encoding": "gzip"})
    return Response(vendor_text(name).encode("utf-8"), media_type=media, headers=headers)
