"""The filesystem DuckDB reads a store through: listed objects from the local cache, the rest from the store.

DuckDB asks a registered fsspec filesystem to ``glob`` each file of a ``read_parquet`` list, then opens it
several times (binding, then each thread); s3fs answers each with HEAD requests and ranged GETs. Here the
ETag and size of every object come from one LIST of its directory (reused ``LISTING_TTL`` seconds), and its
bytes from ``tracedag.pipeline.store.objcache``: after the first read, a query sends the store listings only.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from fsspec import AbstractFileSystem

from tracedag.pipeline.store.objcache import Entry, Fetch, ObjectCache, configured

LISTING_TTL = 1.0
"""Seconds a directory listing (ETags and sizes) is reused: a store wiped and written again is seen after this."""

LOCAL = frozenset({"memory", "file", "local"})
"""Filesystems in this process or on this disk: read directly, never copied into the cache."""

_DELEGATED = ("ls", "find", "cat_file", "pipe_file", "put_file", "get_file",
              "rm_file", "rm", "mkdir", "makedirs", "mv", "created", "checksum")


class CachedFileSystem(AbstractFileSystem):  # type: ignore[misc]  # fsspec ships no type information
    """``inner`` (an s3fs or other fsspec filesystem) with reads of whole objects through ``cache``."""

    cachable = False

    def __init__(self, inner: Any, cache: ObjectCache, ttl: float = LISTING_TTL) -> None:
        super().__init__()
        self.inner = inner
        self.cache = cache
        self.ttl = ttl
        self._listings: dict[str, tuple[float, dict[str, Entry]]] = {}
        self._lock = threading.Lock()
        for name in _DELEGATED:
            setattr(self, name, getattr(inner, name))

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        return _strip(cls.protocol, path)

    def entry(self, path: str) -> Entry | None:
        """The object at ``path`` as the store lists it now (None: not an object there)."""
        key = self._strip_protocol(path)
        parent = key.rpartition("/")[0]
        return self._listing(parent).get(key)

    def _listing(self, parent: str) -> dict[str, Entry]:
        with self._lock:
            hit = self._listings.get(parent)
            now = time.monotonic()
            if hit is not None and now - hit[0] < self.ttl:
                return hit[1]
            try:
                rows = self.inner.ls(parent, detail=True)
            except FileNotFoundError:
                rows = []
            found = {str(r["name"]): _entry(r) for r in rows if r.get("type") == "file"}
            self._listings[parent] = (now, found)
            return found

    def glob(self, path: str, **kwargs: Any) -> Any:
        """A plain path the store lists is answered from the listing; patterns go to the store."""
        if not any(c in path for c in "*?[") and not kwargs.get("detail"):
            found = self.entry(path)
            if found is not None:
                return [found.path]
        return self.inner.glob(path, **kwargs)

    def info(self, path: str, **kwargs: Any) -> Any:
        """Size and ETag of a listed object without a HEAD request."""
        found = self.entry(path)
        if found is None:
            return self.inner.info(path, **kwargs)
        return {"name": found.path, "size": found.size, "type": "file", "ETag": found.etag}

    def exists(self, path: str, **kwargs: Any) -> bool:
        """A listed object exists (no HEAD request)."""
        return self.entry(path) is not None or bool(self.inner.exists(path, **kwargs))

    def isfile(self, path: str) -> bool:
        """A listed object is a file (no HEAD request)."""
        return self.entry(path) is not None or bool(self.inner.isfile(path))

    def isdir(self, path: str) -> bool:
        """A listed object is not a directory (no HEAD request)."""
        return self.entry(path) is None and bool(self.inner.isdir(path))

    def modified(self, path: str) -> Any:
        """A listed object's LastModified (DuckDB asks at each open; no HEAD request)."""
        found = self.entry(path)
        if found is None or found.modified is None:
            return self.inner.modified(path)
        return found.modified

    def _open(self, path: str, mode: str = "rb", block_size: Any = None, autocommit: bool = True,
              cache_options: Any = None, **kwargs: Any) -> Any:
        found = self.entry(path) if mode == "rb" else None
        if found is None or found.size > self.cache.limit:
            return self.inner._open(path, mode=mode, block_size=block_size, autocommit=autocommit,
                                    cache_options=cache_options, **kwargs)
        return self.cache.open(found, self._fetcher(found))

    def _fetcher(self, entry: Entry) -> Fetch:
        """``fetch(start, end)`` of ``entry``'s bytes from the store (a ranged GET)."""
        def fetch(start: int, end: int) -> bytes:
            return bytes(self.inner.cat_file(entry.path, start=start, end=end))

        return fetch


def _entry(row: dict[str, Any]) -> Entry:
    """A listing row (s3fs: ``name``, ``size``, ``ETag``, ``LastModified``) as an ``Entry``."""
    modified = row.get("LastModified") or row.get("mtime")
    etag = row.get("ETag") or row.get("etag") or f"modified {modified}"  # a store without ETags: its mtime
    return Entry(str(row["name"]), str(etag), int(row["size"]), modified)


def _strip(protocols: Any, path: Any) -> Any:
    """``s3://bucket/key`` → ``bucket/key`` for any of ``protocols``."""
    if isinstance(path, list):
        return [_strip(protocols, p) for p in path]
    text = str(path)
    for protocol in (protocols,) if isinstance(protocols, str) else protocols:
        if text.startswith(f"{protocol}://"):
            text = text[len(protocol) + 3:]
            break
    return text.rstrip("/")


_FILESYSTEMS: dict[int, Any] = {}


def reading_filesystem(inner: Any) -> Any:
    """What DuckDB should read ``inner``'s objects through: a ``CachedFileSystem``, or ``inner`` when the
    cache is off (``TRACEDAG_CACHE_SIZE=0``). One per inner filesystem and process (listings are shared)."""
    cache = configured()
    protocols = {inner.protocol} if isinstance(inner.protocol, str) else set(inner.protocol)
    if cache is None or protocols & LOCAL:
        return inner
    found = _FILESYSTEMS.get(id(inner))
    if found is None or found.inner is not inner or found.cache is not cache:
        kind = type("CachedFileSystem", (CachedFileSystem,), {"protocol": inner.protocol})
        found = kind(inner, cache)
        _FILESYSTEMS[id(inner)] = found
    return found
