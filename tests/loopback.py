"""HTTP clients for the servers the tests start on loopback (plain HTTP).

``httpx.Client()`` reads the CA bundle into a new TLS context each time it is made (~20 ms of CPU), even for an
``http://`` URL that never uses it: about 20 s of the suite's CPU went there. A loopback server speaks plain
HTTP, so these clients make no TLS context (``verify=False`` is never exercised: no ``https://`` URL is asked).
"""

from __future__ import annotations

from typing import Any

import httpx


def http_client(**kwargs: Any) -> httpx.Client:
    """``httpx.Client(**kwargs)`` for a plain-HTTP loopback server."""
    return httpx.Client(verify=False, **kwargs)


def openai_client(base_url: str, **kwargs: Any) -> Any:
    """The real ``openai.OpenAI`` client of a scripted model on loopback (its default HTTP client, minus TLS)."""
    import openai

    assert base_url.startswith("http://"), base_url
    return openai.OpenAI(base_url=base_url, http_client=openai.DefaultHttpxClient(verify=False), **kwargs)
