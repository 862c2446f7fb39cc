"""Views that read an object store's files from the local object cache's complete copies (``cachecopy``).

``create_views`` makes a connection's views inside ``native_reads(con)``: there ``local_copies`` names each
listed object that the cache holds complete by its copy's path instead of its URL (``read_parquet`` takes
a list mixing both), and pins the copy until the connection is gone, so DuckDB reads it as a local file,
with no Python call per read. ``pinned_copies(con)`` lists them: a locked-down connection
(``sandbox.lock_down``) must allow exactly those files. The objects it names by URL are looked up in a listing
made now, and DuckDB's opens of them take those entries while ``con`` lives (``StoreReads.hold``). The store's
reading filesystem (fsspec) is registered on ``con`` only when a view names an object by URL (``defer_reads``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from tracedag.pipeline.store.listing import cached_listing, manifest_entries
from tracedag.pipeline.store.objcache import Entry
from tracedag.pipeline.store.remote import Remote, remote_of

logger = logging.getLogger(__name__)

_PINNED: weakref.WeakKeyDictionary[Any, list[str]] = weakref.WeakKeyDictionary()
"""The complete copies each connection's views name (``pinned_copies``)."""

_READER: ContextVar[Any] = ContextVar("tracedag_native_reader", default=None)
"""A weak reference to the connection whose views are being made inside ``native_reads`` (None or ``_URLS``:
views name URLs). Weak: asyncio copies the context into each task it runs (s3fs's listing does), and a copy
freed by its loop thread when the process exits must not drop the last reference to a DuckDB connection
there (its destructor then aborted the process: "FATAL: exception not rethrown", 1 s3fs query in 3)."""
_URLS = object()


@contextlib.contextmanager
def native_reads(con: Any, tables: Iterable[str] | None = None) -> Iterator[None]:
    """Views made meanwhile name complete local copies (``local_copies``), pinned for ``con``'s life. ``tables``: the
    tables whose folders the first lookup lists at once (None: every table of the store)."""
    token = _READER.set(_URLS if _READER.get() is _URLS else weakref.ref(con))
    ahead = _AHEAD.set(None if tables is None else frozenset(tables))
    try:
        yield
    finally:
        _AHEAD.reset(ahead)
        _READER.reset(token)


_AHEAD: ContextVar[frozenset[str] | None] = ContextVar("tracedag_list_ahead", default=None)
"""The tables ``native_reads`` was told its views read (None: any)."""


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
    pinned until the connection of the enclosing ``native_reads`` is gone (outside one: ``uris``). A URL left in
    the list gets the store's reading filesystem registered on that connection (outside one: on every connection
    over the store that has none yet, ``defer_reads``)."""
    held = _READER.get()
    con = held() if held is not None and held is not _URLS else None
    remote = remote_of(data) if any("://" in u for u in uris) else None
    if remote is None:
        return uris
    if con is None:  # the caller runs the URLs on a connection this does not know
        _register_deferred(remote)
        return uris
    reads = remote.cached_reads()
    if reads is None:  # the cache is off: the store's own filesystem reads every URL
        register_reads(con)
        return uris
    out = _copies(con, remote, reads, uris)
    if any(u is o and "://" in u for u, o in zip(uris, out, strict=True)):
        register_reads(con)
    return out


def _copies(con: Any, remote: Remote, reads: Any, uris: list[str]) -> list[str]:
    """``local_copies`` through the store's listings and cache ``reads`` (a ``cachedfs.StoreReads``) for ``con``."""
    known = _known_entries(remote, reads)
    ahead = [u for u in store_uris(remote, _AHEAD.get()) if reads._strip_protocol(u) not in known]
    reads.list_ahead(ahead)  # the views' folders whose files' versions the manifests do not give, at once
    listed = [_entry_of(reads, known, uri) if "://" in uri else None for uri in uris]
    paths = [reads.cache.pin(found) if found is not None else None for found in listed]
    missing = [found for found, path in zip(listed, paths, strict=True) if found is not None and path is None]
    if missing:  # fetched whole now (as a read would fetch them), then read natively: no fsspec, no Python per read
        reads.fetch_whole(missing)
        paths = [path or (reads.cache.pin(found) if found is not None else None) for found, path in zip(listed, paths, strict=True)]
    if known:
        listed, paths = _relisted(reads, known, uris, listed, paths)
    out: list[str] = []
    pinned: list[str] = []
    held = []
    for uri, found, path in zip(uris, listed, paths, strict=True):
        out.append(uri if path is None else str(path))
        if path is not None:
            pinned.append(str(path))
        elif found is not None:
            held.append(found)
    reads.cache.pins.tie(con, pinned)
    reads.hold(con, held)  # DuckDB's opens of these, later in a long query, take the versions listed now
    reads.fetch_ahead([u for u, o in zip(uris, out, strict=True) if u is o and "://" in u])
    if pinned:
        _PINNED.setdefault(con, []).extend(pinned)
    return out


def _known_entries(remote: Remote, reads: Any) -> dict[str, Entry]:
    """The store's objects whose versions (ETag, size) its manifests give, by path (``reads``' keys): found
    without listing their folders. Only when ``reads`` reads a listed version alone (``s3lite``'s If-Match): a
    file overwritten in place then fails to be read instead of being kept as the version the manifest names."""
    if reads.lite is None:
        return {}
    root = reads._strip_protocol(remote.uri("tables"))
    return {f"{root}/{key}": Entry(f"{root}/{key}", etag, size) for key, (size, etag) in manifest_entries(remote).items()}


def _entry_of(reads: Any, known: dict[str, Entry], uri: str) -> Entry | None:
    """``uri``'s object as its manifest gives it, else as the store lists it now."""
    found = known.get(reads._strip_protocol(uri))
    return found if found is not None else reads.listed(uri)


def _relisted(reads: Any, known: dict[str, Entry], uris: list[str], listed: list[Entry | None],
              paths: list[Any]) -> tuple[list[Entry | None], list[Any]]:
    """Objects taken from their manifests that have no complete copy though they are small enough for one (the
    store no longer holds that version: overwritten in place, or gone): as the store lists them now, fetched
    whole again; the store's answer is what is read, never a copy of the manifest's version from before."""
    listed, paths = list(listed), list(paths)
    for k, (uri, found, path) in enumerate(zip(uris, listed, paths, strict=True)):
        if path is not None or found is None or found.size > reads.cache.whole:
            continue
        if known.get(found.path) is not found:
            continue
        now = reads.listed(uri)
        listed[k] = now
        if now is not None and now != found:
            reads.fetch_whole([now])
            paths[k] = reads.cache.pin(now)
    return listed, paths


_DEFERRED: weakref.WeakKeyDictionary[Any, Remote] = weakref.WeakKeyDictionary()
"""Connections over a store whose reading filesystem is not registered yet (``defer_reads``)."""
_DEFERRED_LOCK = threading.Lock()


def defer_reads(con: Any, remote: Remote) -> None:
    """Register ``remote``'s reading filesystem on ``con`` only once a statement names one of its objects by URL
    (``local_copies``, ``register_reads``): views that name complete local copies alone need none, and making it
    imports fsspec (~0.05 s of CPU in a fresh process)."""
    with _DEFERRED_LOCK:
        _DEFERRED[con] = remote


def register_reads(con: Any) -> None:
    """Register on ``con`` the reading filesystem ``defer_reads`` put off (nothing when it is registered)."""
    with _DEFERRED_LOCK:
        remote = _DEFERRED.pop(con, None)
    if remote is not None:
        con.register_filesystem(remote.reading_fs())


def _register_deferred(remote: Remote) -> None:
    """``register_reads`` on every connection over ``remote`` that has not its filesystem yet (a caller is about to
    name its URLs on one of them; a closed one is passed over)."""
    with _DEFERRED_LOCK:
        cons = [con for con, r in _DEFERRED.items() if r == remote]
    for con in cons:
        try:
            register_reads(con)
        except Exception as e:  # a connection closed meanwhile: it reads nothing more
            logger.debug("no filesystem registered on a connection over %s: %s", remote.url, e)


def store_uris(remote: Remote, only: Iterable[str] | None = None) -> list[str]:
    """The URL of every file the store's manifests name now (``listing.cached_listing``; ``only``: of these tables)."""
    return [remote.uri(f"tables/{table}/{rel}") for tables in cached_listing(remote).values()
            for table, files in tables.items() if only is None or table in only for rel in files]


def pinned_copies(con: Any) -> list[str]:
    """The local copies ``con``'s views read (a locked-down connection must allow exactly these files)."""
    return sorted(set(_PINNED.get(con, [])))
