"""Reading writers' manifests on an object store: the files every writer published now, with their sizes and ETags
(``manifests`` publishes them; its docstring describes the protocol).

A reader takes the newest generation of every writer and unions them (``read_listing``), reused for ``LISTING_TTL``
seconds within a process (``cached_listing``); ``remote_files`` gives a table's files as paths under a work
directory and ``source_uris`` where their bytes are.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tracedag.pipeline.store.remote import Remote, binding
from tracedag.schemas.layout import table_dir, tables_dir

MANIFESTS = "manifests"
SEP = "--"
"""Between the writer id and the local file name in a published file's name."""
LISTING_TTL = 1.0
"""Seconds a process reuses a store listing (one command lists several tables in a row)."""

Tables = dict[str, dict[str, int]]  # table -> {path under tables/<table>/: size}
ETags = dict[str, str]  # "<table>/<path under tables/<table>/>" -> the ETag the store gave the file after its upload


def published_name(writer: str, rel: str) -> str:
    """``recv_hour=5/part-1.parquet`` of writer ``c1`` → ``recv_hour=5/c1--part-1.parquet``."""
    folder, _, name = rel.rpartition("/")
    return f"{folder}/{writer}{SEP}{name}" if folder else f"{writer}{SEP}{name}"


def local_name(rel: str) -> str:
    """The inverse of ``published_name``: the file name in its writer's work directory."""
    folder, _, name = rel.rpartition("/")
    base = name.partition(SEP)[2] or name
    return f"{folder}/{base}" if folder else base


def generations(remote: Remote, writer: str) -> list[str]:
    """The keys of ``writer``'s manifest generations, oldest first."""
    try:
        names = remote.reads.ls(remote.key(f"{MANIFESTS}/{writer}"), detail=False)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.endswith(".json"))


def _writers(remote: Remote) -> list[str]:
    try:
        entries = remote.reads.ls(remote.key(MANIFESTS), detail=True)
    except FileNotFoundError:
        return []
    return sorted(e["name"].rstrip("/").rpartition("/")[2] for e in entries if e.get("type") == "directory")


def newest_manifest(remote: Remote, writer: str) -> dict[str, Any] | None:
    """The newest manifest of ``writer`` (None: it published nothing yet)."""
    for _ in range(3):  # a generation deleted between the listing and the read: list again
        gens = generations(remote, writer)
        if not gens:
            return None
        try:
            raw: dict[str, Any] = json.loads(remote.reads.cat_file(gens[-1]))
            return raw
        except FileNotFoundError:
            continue
    return None


def read_listing(remote: Remote) -> dict[str, Tables]:
    """Every writer's newest manifest tables: ``{writer: {table: {rel: size}}}``."""
    return _read_all(remote)[0]


def _read_all(remote: Remote) -> tuple[dict[str, Tables], ETags]:
    """``read_listing`` and the ETags those manifests give (``manifest_etags``)."""
    out: dict[str, Tables] = {}
    etags: ETags = {}
    for writer in _writers(remote):
        found = newest_manifest(remote, writer)
        if found is not None:
            out[writer] = {t: {str(k): int(v) for k, v in files.items()} for t, files in found.get("tables", {}).items()}
            etags.update(etags_of(found, out[writer]))
    return out, etags


def etags_of(manifest: dict[str, Any], tables: Tables) -> ETags:
    """The ETags ``manifest`` gives for files it lists (others, or ones not strings, are left out)."""
    out: ETags = {}
    given = manifest.get("etags")
    for table, files in (given.items() if isinstance(given, dict) else ()):
        listed = tables.get(table, {})
        for rel, etag in (files.items() if isinstance(files, dict) else ()):
            if isinstance(etag, str) and etag and rel in listed:
                out[f"{table}/{rel}"] = etag
    return out


_CACHE: dict[str, tuple[float, dict[str, Tables], ETags]] = {}


def forget_listing(remote: Remote) -> None:
    """Drop this process's listing of ``remote`` (a writer that just published reads its new generation at once)."""
    _CACHE.pop(remote.url, None)


def cached_listing(remote: Remote, fresh: bool = False) -> dict[str, Tables]:
    """``read_listing`` reused for ``LISTING_TTL`` seconds within a process."""
    return _cached(remote, fresh)[1]


def _cached(remote: Remote, fresh: bool = False) -> tuple[float, dict[str, Tables], ETags]:
    hit = _CACHE.get(remote.url)
    now = time.monotonic()
    if hit is not None and not fresh and now - hit[0] < LISTING_TTL:
        return hit
    listing, etags = _read_all(remote)
    found = _CACHE[remote.url] = (now, listing, etags)
    return found


def manifest_entries(remote: Remote, fresh: bool = False) -> dict[str, tuple[int, str]]:
    """``{"<table>/<rel>": (size, etag)}`` of the listed files whose manifest gives their ETag (the listing of
    ``cached_listing``): their versions, known without listing their folders."""
    _, listing, etags = _cached(remote, fresh)
    return {key: (listing_size, etag) for key, etag in etags.items()
            if (listing_size := _size_in(listing, key)) is not None}


def _size_in(listing: dict[str, Tables], key: str) -> int | None:
    table, _, rel = key.partition("/")
    for tables in listing.values():
        size = tables.get(table, {}).get(rel)
        if size is not None:
            return size
    return None


def remote_files(data: Path, table: str, fresh: bool = False) -> list[tuple[Path, int]]:
    """The files of ``table`` other writers published, as paths under ``data`` that do not exist locally.

    A path's bytes are at ``source_uris(data, [path])``. The work directory's own published files are its
    local ones, so they are left out, unless they are only in the store (published, then removed here).
    """
    bound = binding(data)
    if bound is None:
        return []
    remote, writer = bound
    root = table_dir(data, table)
    out: list[tuple[Path, int]] = []
    for owner, tables in cached_listing(remote, fresh).items():
        for rel, size in tables.get(table, {}).items():
            if owner == writer and (root / local_name(rel)).exists():
                continue
            out.append((root / rel, size))
    return out


def source_uris(data: Path, files: list[Path]) -> list[str]:
    """Where listed files' bytes are: their local paths, or their URLs in the store ``data`` works on."""
    bound = binding(data)
    if bound is None:
        return [str(f) for f in files]
    root = tables_dir(data)
    return [str(f) if f.exists() else bound[0].uri(f"tables/{f.relative_to(root).as_posix()}") for f in files]


