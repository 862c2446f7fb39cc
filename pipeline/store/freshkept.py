"""``freshness.freshness``'s answers kept for later processes: in the work directory, and on an object store
published beside its tables, for every reader's work directory.

An answer depends on the files of ``traces`` and ``materialized_traces`` and on the signature (the SQL
definitions, the human labels) alone, and a published file never changes (a build, a round or a collection
writes new names). So an answer is kept under a digest of those names (``key``):

- in ``<data>/state/materialized/fresh-<digest>.json`` (only the newest; ``files.keep_newest``);
- on an object store, as ``<store>/state/materialized-fresh.json``, one object holding the newest answer a
  process computed and its digest. The names in the key are then the store's (``<writer>--<name>``; a work
  directory's own files under the names it publishes them with), so a fresh work directory of any reader
  computes the same key and takes the answer with one GET instead of scanning the tables (0.07-0.17 s CPU).
  An answer whose digest is not its own listing's is ignored: a new round or build, a collection, another
  SQL definition or a store wiped and written again (new file names; the object is gone with the store)
  each make another digest. A process that cannot write the store (read-only keys) keeps it locally only.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from tracedag.pipeline.store.files import keep_newest
from tracedag.pipeline.store.listing import SEP, published_name
from tracedag.pipeline.store.remote import Remote, binding
from tracedag.schemas.layout import tables_dir

logger = logging.getLogger(__name__)

KEPT = "materialized"
"""``<data>/state/materialized/``: the kept answers (``freshness.KEPT``)."""
PUBLISHED = "state/materialized-fresh.json"
"""The object under an object store's root holding the newest answer and its digest."""

_REFUSED: set[str] = set()
"""Stores that refused this process's PUT (read-only keys): not asked again."""


def key(data: Path, signature: str, version: str, files: list[Path]) -> tuple[str, ...]:
    """What an answer for ``files`` (the ``traces`` and state files listed now) depends on: the store, the signature,
    the answer's meaning (``version``) and the files' names (an object store's: the same in every work directory)."""
    bound = binding(data)
    if bound is None:
        return (str(data), signature, version, *(str(f) for f in files))
    return (bound[0].url, signature, version, *(store_names(data, files) or ()))


def store_names(data: Path, files: list[Path]) -> tuple[str, ...] | None:
    """The store's names (``tables/``-relative, sorted) of the listed ``files`` of the work directory ``data``: the
    same in every work directory of its store (None: ``data`` is a local store)."""
    bound = binding(data)
    if bound is None:
        return None
    return tuple(sorted(_store_name(data, bound[1], f) for f in files))


def _store_name(data: Path, writer: str, path: Path) -> str:
    """``tables/``-relative name of a listed file in the store: a file of this work directory (no ``<writer>--``
    yet) under the name it is published with."""
    rel = path.relative_to(tables_dir(data)).as_posix()
    return rel if SEP in rel.rpartition("/")[2] else published_name(writer, rel)


def digest(found: tuple[str, ...]) -> str:
    """The digest of a ``key``."""
    return hashlib.sha256("\0".join(found).encode()).hexdigest()[:32]


def _path(data: Path, found: tuple[str, ...]) -> Path:
    return data / "state" / KEPT / f"fresh-{digest(found)}.json"


def read(data: Path, found: tuple[str, ...]) -> dict[str, Any] | None:
    """The answer kept for ``found`` (a ``key``): this work directory's, else the store's published one (then kept
    here too); None when neither is for this key."""
    try:
        doc = _checked(json.loads(_path(data, found).read_text(encoding="utf-8")))
        if doc is not None:
            return doc
    except (OSError, ValueError):
        pass
    bound = binding(data)
    doc = None if bound is None else _published(bound[0], digest(found))
    if doc is not None:
        keep_newest(data, _path(data, found), json.dumps(doc))
    return doc


def _checked(doc: Any) -> dict[str, Any] | None:
    """``doc`` when it has an answer's fields (a damaged file is not an answer)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("stale"), list):
        return None
    if not isinstance(doc.get("usable"), bool) or not isinstance(doc.get("traces"), int):
        return None
    return doc


def _published(remote: Remote, wanted: str) -> dict[str, Any] | None:
    """The store's published answer when its digest is ``wanted`` (None: none, another listing's, unreadable)."""
    raw = get(remote, PUBLISHED)
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("digest") != wanted:
        return None
    return _checked(doc.get("answer"))


def keep(data: Path, found: tuple[str, ...], doc: dict[str, Any]) -> None:
    """Keep the answer ``doc`` for ``found`` in the work directory, and publish it when ``data`` works on a store."""
    text = json.dumps(doc)
    keep_newest(data, _path(data, found), text)
    bound = binding(data)
    if bound is not None:
        publish(bound[0], digest(found), doc)


def publish(remote: Remote, found: str, doc: dict[str, Any]) -> bool:
    """Put ``doc`` as the store's newest answer (its digest ``found``); False when the store refused it."""
    return put(remote, PUBLISHED, json.dumps({"digest": found, "answer": doc}).encode())


def put(remote: Remote, rel: str, body: bytes) -> bool:
    """Put ``body`` as the object ``rel`` under the store's root (a reader's answer kept for the others, last writer
    wins); False when the store refused it or refused one before (read-only keys: not asked again)."""
    if remote.url in _REFUSED:
        return False
    try:
        if remote.lite is not None:
            remote.lite.put(remote.key(rel), body)
        else:
            remote.fs.pipe_file(remote.key(rel), body)
    except Exception as e:  # read-only keys, a store down: the readers compute it themselves
        _REFUSED.add(remote.url)
        logger.info("%s: %s is not published (%s)", remote.url, rel, e)
        return False
    return True


def get(remote: Remote, rel: str) -> bytes | None:
    """The object ``rel`` under the store's root (None: none, or the store does not answer)."""
    try:
        return bytes(remote.reads.cat_file(remote.key(rel)))
    except FileNotFoundError:
        return None
    except Exception as e:  # a store that does not answer: the answer is computed instead
        logger.info("%s: %s is not readable (%s)", remote.url, rel, e)
        return None
