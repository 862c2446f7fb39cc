"""Views that read an object store's files from the local object cache's complete copies (``cachecopy``).

``create_views`` makes a connection's views inside ``native_reads(con)``: there ``local_copies`` names each
listed object that the cache holds complete by its copy's path instead of its URL (``read_parquet`` takes
a list mixing both), and pins the copy until the connection is gone, so DuckDB reads it as a local file,
with no Python call per read. ``pinned_copies(con)`` lists them: a locked-down connection
(``sandbox.lock_down``) must allow exactly those files. The objects it names by URL are looked up in a listing
made now, and DuckDB's opens of them take those entries while ``con`` lives (``CachedFileSystem.hold``).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from tracedag.pipeline.store.manifests import cached_listing
from tracedag.pipeline.store.remote import Remote, remote_of

_PINNED: weakref.WeakKeyDictionary[Any, list[str]] = weakref.WeakKeyDictionary()
"""The complete copies each connection's views name (``pinned_copies``)."""

_READER: ContextVar[Any] = ContextVar("tracedag_native_reader", default=None)
"""A weak reference to the connection whose views are being made inside ``native_reads`` (None or ``_URLS``:
views name URLs). Weak: asyncio copies the context into each task it runs (s3fs's listing does), and a copy
freed by its loop thread when the process exits must not drop the last reference to a DuckDB connection
there (its destructor then aborted the process: "FATAL: exception not rethrown", 1 s3fs query in 3)."""
_URLS = object()


@contextlib.contextmanager
def native_reads(con: Any) -> Iterator[None]:
    """Views made meanwhile name complete local copies (``local_copies``), pinned for ``con``'s life."""
    token = _READER.set(_URLS if _READER.get() is _URLS else weakref.ref(con))
    try:
        yield
    finally:
        _READER.reset(token)


@contextlib.contextmanager
def urls_only() -> Iterator[None]:
    """Views made meanwhile name the store's URLs, even inside ``native_reads`` (SQL shown to a user or kept,
    as ``tracedag sql --init`` writes it: a copy may be evicted once the connection is gone)."""
    token = _READER.set(_URLS)
    try:
        yield
    finally:
        _READER.reset(token)


def local_copies(data: Path, uris: list[str]) -> list[str]:
    """``uris`` of ``data``'s store with each object that has a complete local copy named by the copy's path,
    pinned until the connection of the enclosing ``native_reads`` is gone (outside one: ``uris``)."""
    held = _READER.get()
    con = held() if held is not None and held is not _URLS else None
    remote = remote_of(data) if con is not None and any("://" in u for u in uris) else None
    fs: Any = remote.reading_fs() if remote is not None else None
    if remote is None or not getattr(fs, "native_copies", False):  # the cache is off: the store's own filesystem
        return uris
    fs.list_ahead(store_uris(remote))  # every folder at once, on the first view; fresh listings after it
    out: list[str] = []
    pinned: list[str] = []
    held = []
    for uri in uris:
        found = fs.listed(uri) if "://" in uri else None
        path = fs.cache.pin(found) if found is not None else None
        out.append(uri if path is None else str(path))
        if path is not None:
            pinned.append(str(path))
        elif found is not None:
            held.append(found)
    fs.cache.pins.tie(con, pinned)
    fs.hold(con, held)  # DuckDB's opens of these, later in a long query, take the versions listed now
    fs.fetch_ahead([u for u, o in zip(uris, out, strict=True) if u is o and "://" in u])
    if pinned:
        _PINNED.setdefault(con, []).extend(pinned)
    return out


def store_uris(remote: Remote) -> list[str]:
    """The URL of every file the store's manifests name now (``manifests.cached_listing``)."""
    return [remote.uri(f"tables/{table}/{rel}") for tables in cached_listing(remote).values()
            for table, files in tables.items() for rel in files]


def pinned_copies(con: Any) -> list[str]:
    """The local copies ``con``'s views read (a locked-down connection must allow exactly these files)."""
    return sorted(set(_PINNED.get(con, [])))
