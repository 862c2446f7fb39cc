"""How DuckDB reads a store: listed objects from the local cache, the rest from the store.

``StoreReads`` (one per store and process, ``store_reads``) keeps the store's listings and the local object cache:
the ETag and size of every object come from one LIST of its directory (reused ``LISTING_TTL`` seconds; a
connection's views list every directory of the store at once, ``list_ahead``, and DuckDB's opens of their files
take the entries the views were made from, ``hold``), and its bytes from ``tracedag.pipeline.store.objcache``:
after the first read, a query sends the store listings only.

A view made inside ``cachereads.native_reads(con)`` names the complete local copy of each object that has one
(``cachereads.local_copies``), pinned until ``con`` is gone: DuckDB reads it as a local file. Only a view that
names an object by its URL needs the fsspec filesystem DuckDB reads URLs through (``cachedfsspec``, made by
``cachedfsspec.reading_filesystem``, registered on the connection then: importing fsspec costs a fresh process ~0.05 s of
CPU, half of a local named query's). DuckDB asks it to ``glob`` each file of a ``read_parquet`` list, then opens it
several times (binding, then each thread); s3fs answers each with HEAD requests and ranged GETs, this one from
the listings and the cache.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from tracedag.pipeline.store.objcache import Entry, Fetch, ObjectCache, configured

logger = logging.getLogger(__name__)

LISTING_TTL = 1.0
"""Seconds a directory listing (ETags and sizes) is reused: a store wiped and written again is seen after this by
the views made then (a connection made before reads the versions its views listed, ``HOLD_SECONDS`` at most)."""

HOLD_SECONDS = 60.0
"""Seconds the entries a connection's views were made from answer DuckDB's opens of their files (``hold``): a
long query's opens list nothing again; a connection that old lists the store again, as a new one does."""

LIST_WAIT = 120.0
"""Seconds a lookup waits for another thread's LIST of the same folder (then it lists the folder itself)."""

LOCAL = frozenset({"memory", "file", "local"})
"""Filesystems in this process or on this disk: read directly, never copied into the cache."""



class StoreReads:
    """A store's listings and object cache: its own filesystem (s3fs or another fsspec one, made by ``make_inner``
    when first needed), with listings and ranged reads of listed objects made by ``lite`` (``s3lite``) when given,
    and object bytes kept in ``cache``. No fsspec until ``filesystem`` is asked for."""

    native_copies = True  # cachereads.local_copies: its cache's complete copies can be named instead of URLs

    def __init__(self, make_inner: Callable[[], Any], cache: ObjectCache, lite: Any = None,
                 ttl: float = LISTING_TTL, protocol: Any = "s3") -> None:
        self._make_inner = make_inner
        self.protocol = protocol
        self.key: Any = None  # the store (a ``Remote``) or filesystem it was made for (``store_reads``)
        self.fs: Any = None  # the fsspec filesystem DuckDB reads its URLs through, once made (``cachedfsspec``)
        self.lite = lite
        self.cache = cache
        self.ttl = ttl
        self._listings: dict[str, tuple[float, dict[str, Entry]]] = {}
        self._busy: dict[str, threading.Event] = {}  # folders being listed now, set when done
        self._held: dict[str, tuple[Entry, float, int]] = {}  # objects views name: (entry, when, connections)
        self._owners: weakref.WeakKeyDictionary[object, set[str]] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    @property
    def inner(self) -> Any:
        """The store's own filesystem (made on first use: importing s3fs costs a fresh process ~1 s)."""
        return self._make_inner()

    def _strip_protocol(self, path: Any) -> Any:
        return _strip(self.protocol, path)

    def entry(self, path: str) -> Entry | None:
        """The object at ``path`` as a live connection's views listed it within ``HOLD_SECONDS`` (``hold``), else as
        the store lists it now (None: not an object there). DuckDB opens a view's files as a query reaches them,
        seconds after the view was made in a long query: each would list its folder again once the listing is
        ``ttl`` old."""
        key = self._strip_protocol(path)
        held = self._held.get(key)
        if held is not None and time.monotonic() - held[1] < HOLD_SECONDS:
            return held[0]
        return self.listed(key)

    def listed(self, path: str) -> Entry | None:
        """The object at ``path`` as the store lists it now (within ``ttl``), whatever views hold."""
        key = self._strip_protocol(path)
        return self._listing(key.rpartition("/")[0]).get(key)

    def hold(self, owner: object, entries: list[Entry]) -> None:
        """Answer ``entry`` of these objects with these entries (the versions ``owner``'s views were made from, listed
        just now) until ``owner``, a connection, is gone, for at most ``HOLD_SECONDS``; views made later (by any
        connection) hold the entries they listed instead."""
        if not entries:
            return
        now = time.monotonic()
        with self._lock:
            keys = self._owners.get(owner)
            if keys is None:
                keys = self._owners[owner] = set()
                weakref.finalize(owner, self._release, keys)
            for found in entries:
                count = self._held.get(found.path, (found, now, 0))[2]
                if found.path not in keys:
                    keys.add(found.path)
                    count += 1
                self._held[found.path] = (found, now, count)

    def _release(self, keys: set[str]) -> None:
        """``hold``'s entries of a connection that is gone: dropped when no other connection holds them."""
        with self._lock:
            for key in keys:
                held = self._held.get(key)
                if held is not None and held[2] > 1:
                    self._held[key] = (held[0], held[1], held[2] - 1)
                elif held is not None:
                    del self._held[key]

    def _listing(self, parent: str) -> dict[str, Entry]:
        """``parent``'s objects as listed within ``ttl`` seconds, else listed now: outside the lock, so that
        several folders are listed at once (``list_ahead``), and once for the threads that ask meanwhile (DuckDB
        opens a view's files from several threads: each would send its own LIST)."""
        while True:
            with self._lock:
                hit = self._listings.get(parent)
                now = time.monotonic()
                if hit is not None and now - hit[0] < self.ttl:
                    return hit[1]
                busy = self._busy.get(parent)
                if busy is None:
                    busy = self._busy[parent] = threading.Event()
                    break
            busy.wait(LIST_WAIT)  # then the listing it made, or (it failed, or is stale already) one made here
        try:
            try:
                rows = (self.lite or self.inner).ls(parent, detail=True)
            except FileNotFoundError:
                rows = []
            found = {str(r["name"]): _entry(r) for r in rows if r.get("type") == "file"}
            with self._lock:
                self._listings[parent] = (now, found)
            return found
        finally:
            with self._lock:
                self._busy.pop(parent, None)
            busy.set()

    def list_ahead(self, paths: Iterable[str]) -> None:
        """List the folders of ``paths`` (objects of the store) not listed within ``ttl`` seconds, several at
        once: a connection's views look up their files' entries one view after another, a LIST each (a round
        trip each: 11 of them on a scored store)."""
        now = time.monotonic()
        parents = dict.fromkeys(self._strip_protocol(p).rpartition("/")[0] for p in paths)
        with self._lock:
            stale = [p for p in parents if p not in self._listings or now - self._listings[p][0] >= self.ttl]
        if len(stale) > 1:
            for _ in _listers().map(self._listing, stale):
                pass

    def fetch_whole(self, entries: list[Entry]) -> None:
        """Fetch these objects whole into complete copies now, several at once (those too big for one, or that fail,
        are left to DuckDB's reads through ``filesystem``, which says why a read fails)."""
        todo = [e for e in entries if e.size <= self.cache.whole]
        if todo:
            for _ in _listers().map(self._fetch_one, todo):
                pass

    def _fetch_one(self, entry: Entry) -> None:
        try:
            self.cache.fetch(entry, self._fetcher(entry))
        except Exception as e:  # read by URL then: the read that needs it fetches it, or says why it cannot
            logger.info("%s not fetched whole: %s", entry.path, e)

    def fetch_ahead(self, uris: list[str]) -> None:
        """Start the GETs of ``uris``, one view's files not held whole, in the background now (the cache fetches
        whole those of at most ``whole`` bytes): DuckDB opens the first to bind the view, then each as a scan
        reaches it, after every view is made; the first comes before any other view's files but firsts."""
        for k, uri in enumerate(uris):
            found = self.entry(uri)
            if found is not None and found.size <= self.cache.limit:
                self.cache.prefetch(found, self._fetcher(found), first=k == 0)

    def _fetcher(self, entry: Entry) -> Fetch:
        """``fetch(start, end)`` of ``entry``'s bytes from the store (a ranged GET)."""
        if self.lite is not None:  # If-Match: bytes of the listed version only, never a newer one's
            lite = self.lite
            return lambda start, end: bytes(lite.cat_file(entry.path, start, end, etag=entry.etag))

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


LISTERS = 6
"""Folders one process lists at once (``StoreReads.list_ahead``): threads kept for the process, each
with its own kept-alive connection to the store."""
_LISTERS: list[Any] = []
_LISTERS_LOCK = threading.Lock()


def _listers() -> Any:
    """The process's listing threads (made on first use)."""
    with _LISTERS_LOCK:
        if not _LISTERS:
            from concurrent.futures import ThreadPoolExecutor

            _LISTERS.append(ThreadPoolExecutor(LISTERS, thread_name_prefix="tracedag-list"))
        return _LISTERS[0]


_READS: dict[int, StoreReads] = {}


def store_reads(inner: Any, lite: Any = None, protocol: Any = None, key: Any = None) -> StoreReads | None:
    """The listings and object cache a store's objects are read through (one per store and process: listings are
    shared), or None when the cache is off (``TRACEDAG_CACHE_SIZE=0``) or the store is local.

    ``inner``: the store's fsspec filesystem, or a function making it (then ``protocol`` names its protocol and
    ``key`` the store it belongs to); ``lite``: an ``s3lite.S3Lite`` for listings and reads.
    """
    make = inner if callable(inner) and protocol is not None else (lambda: inner)
    protocol = protocol if protocol is not None else inner.protocol
    protocols = {protocol} if isinstance(protocol, str) else set(protocol)
    cache = configured()
    if cache is None or protocols & LOCAL:
        return None
    owner = key if key is not None else inner
    found = _READS.get(id(owner))
    if found is None or found.key is not owner or found.cache is not cache:
        found = StoreReads(make, cache, lite, protocol=protocol)
        found.key = owner
        _READS[id(owner)] = found
    return found
