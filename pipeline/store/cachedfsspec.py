"""The fsspec filesystem DuckDB reads a store's URLs through: a ``cachedfs.StoreReads``'s listings and cache.

Made only when a view names an object by its URL (``reading_filesystem``): a connection whose views all name
complete local copies registers none, and its process need not import fsspec (~0.05 s of CPU).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from fsspec import AbstractFileSystem

from tracedag.pipeline.store.cachedfs import StoreReads, _strip, store_reads

_DELEGATED = ("ls", "find", "cat_file", "pipe_file", "put_file", "get_file",
              "rm_file", "rm", "mkdir", "makedirs", "mv", "created", "checksum")
"""Calls made by the store's own filesystem (s3fs)."""

_SHARED = ("cache", "lite", "entry", "listed", "hold", "list_ahead", "fetch_ahead", "_fetcher", "_held", "_listings",
           "native_copies", "inner", "key")
"""Attributes of the ``StoreReads`` this filesystem reads through, read as its own."""


class CachedFileSystem(AbstractFileSystem):  # type: ignore[misc]  # fsspec ships no type information
    """The store's filesystem as DuckDB reads it: listed objects' sizes and ETags from ``reads``' listings (no HEAD
    request), their bytes from its object cache; the rest from the store's own filesystem."""

    cachable = False

    def __init__(self, reads: StoreReads) -> None:
        super().__init__()
        self.reads: StoreReads = reads
        for name in _DELEGATED:
            setattr(self, name, _delegate(reads, name))

    def __getattr__(self, name: str) -> Any:
        reads = self.__dict__.get("reads")
        if reads is not None and name in _SHARED:
            return getattr(reads, name)
        raise AttributeError(name)

    @property
    def ttl(self) -> float:
        """Seconds a listing is reused (``cachedfs.LISTING_TTL``)."""
        ttl: float = self.reads.ttl
        return ttl

    @ttl.setter
    def ttl(self, value: float) -> None:
        self.reads.ttl = value

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        return _strip(cls.protocol, path)

    def glob(self, path: str, **kwargs: Any) -> Any:
        """A plain path the store lists is answered from the listing; patterns go to the store."""
        if not any(c in path for c in "*?[") and not kwargs.get("detail"):
            found = self.reads.entry(path)
            if found is not None:
                return [found.path]
        return self.reads.inner.glob(path, **kwargs)

    def info(self, path: str, **kwargs: Any) -> Any:
        """Size and ETag of a listed object without a HEAD request."""
        found = self.reads.entry(path)
        if found is None:
            return self.reads.inner.info(path, **kwargs)
        return {"name": found.path, "size": found.size, "type": "file", "ETag": found.etag}

    def exists(self, path: str, **kwargs: Any) -> bool:
        """A listed object exists (no HEAD request)."""
        return self.reads.entry(path) is not None or bool(self.reads.inner.exists(path, **kwargs))

    def isfile(self, path: str) -> bool:
        """A listed object is a file (no HEAD request)."""
        return self.reads.entry(path) is not None or bool(self.reads.inner.isfile(path))

    def isdir(self, path: str) -> bool:
        """A listed object is not a directory (no HEAD request)."""
        return self.reads.entry(path) is None and bool(self.reads.inner.isdir(path))

    def modified(self, path: str) -> Any:
        """A listed object's LastModified (DuckDB asks at each open; no HEAD request)."""
        found = self.reads.entry(path)
        if found is None or found.modified is None:
            return self.reads.inner.modified(path)
        return found.modified

    def _open(self, path: str, mode: str = "rb", block_size: Any = None, autocommit: bool = True,
              cache_options: Any = None, **kwargs: Any) -> Any:
        found = self.reads.entry(path) if mode == "rb" else None
        if found is None or found.size > self.reads.cache.limit:
            return self.reads.inner._open(path, mode=mode, block_size=block_size, autocommit=autocommit,
                                          cache_options=cache_options, **kwargs)
        return self.reads.cache.open(found, self.reads._fetcher(found))


def _delegate(reads: StoreReads, name: str) -> Callable[..., Any]:
    """``fs.<name>(...)`` made by the store's own filesystem."""
    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(reads.inner, name)(*args, **kwargs)

    call.__name__ = name
    return call


def reading_filesystem(inner: Any, lite: Any = None, protocol: Any = None, key: Any = None) -> Any:
    """What DuckDB should read a store's objects through: a ``CachedFileSystem`` over ``cachedfs.store_reads`` (one
    per store and process), or the store's filesystem when the cache is off (``TRACEDAG_CACHE_SIZE=0``) or the store
    is local. ``inner``, ``lite``, ``protocol``, ``key``: as ``store_reads`` takes them."""
    reads = store_reads(inner, lite, protocol, key)
    if reads is None:
        make = inner if callable(inner) and protocol is not None else (lambda: inner)
        return make()
    with _LOCK:
        if reads.fs is None:
            reads.fs = type("CachedFileSystem", (CachedFileSystem,), {"protocol": reads.protocol})(reads)
        return reads.fs


_LOCK = threading.Lock()
