"""Each waiting conversation's rows (``mixedkept.parts``) on disk, for every process reading the store (issue #31).

A poll that must compute the rows of the conversations whose traces wait to be stored costs 0.5-0.9 s of CPU
(a connection with every view, the shared macros, the restriction, DuckDB's planning of the SQL), however few they
are. The live collector computes them once after each score round for the queries polled lately (``prepare`` in
``store.mixed``) and writes them here; a poll reads them instead (``part``): a file per query and parameters,
``<data>/state/mixed/<digest>.arrow`` (Arrow IPC, written atomically), holding the rows of every conversation
it computed and, in its metadata, the digest of each conversation's key (``mixedkept.parts``: the query, its
values, the SQL and the labels, every file of the other tables, its traces, and the path, size and modification
time of each file holding one of them) and where its rows are. A reader takes a conversation's rows only when the
digest of the key it sees now is there: a new round, a late span, a compaction or a label names other files, so
another key, and the reader computes it (never rows of other files). The file holds the conversations waiting
when it was written: each write drops the others.

Which queries the collector computes: those a reader asked about within ``WANT_SECONDS``, each named by a
``<digest>.want`` file (its name and values as JSON, its modification time touched by the readers at most every
``TOUCH_SECONDS``): nobody polls, nothing is computed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from tracedag.schemas.layout import state_dir

logger = logging.getLogger(__name__)

DIR = "mixed"
"""``<data>/state/mixed/``: the rows files and the queries wanted."""
WANT_SECONDS = 60.0
"""A query is computed after a round when a reader asked about it this recently."""
TOUCH_SECONDS = 5.0
"""A reader touches a query's ``.want`` file at most this often."""
PARTS_KEY = b"tracedag.mixed.parts"
"""Schema metadata of a rows file: JSON ``{"base": digest, "parts": {conversation key digest: [offset, rows]}}``."""


def query_digest(query: tuple[object, ...]) -> str:
    """The digest naming a query's files (``query``: the store, the name, its values, the failure threshold)."""
    return hashlib.sha256(repr(query).encode()).hexdigest()[:24]


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def rows_path(data: Path, query: str) -> Path:
    return state_dir(data) / DIR / f"{query}.arrow"


@dataclass(frozen=True)
class Loaded:
    """A rows file as read: its stamp (size, modification time, inode), the digest of what every conversation's key
    shares (``mixedkept.Sources.base``), its rows and where each conversation's are (offset, rows) by its key's
    digest."""

    stamp: tuple[int, int, int]
    base: str
    table: pa.Table
    parts: dict[str, tuple[int, int]]

    @property
    def schema(self) -> pa.Schema:
        return self.table.schema

    def part(self, digest: str) -> pa.Table:
        """One conversation's rows (``digest`` of its key: one of ``parts``)."""
        at, n = self.parts[digest]
        return self.table.slice(at, n)

    def rows(self, digests: list[str]) -> pa.Table:
        """The rows of the conversations ``digests`` (each one of ``parts``, once) as one table: the file's whole
        table when they are all of it (a poll of the state the collector wrote), else one take."""
        if len(digests) == len(self.parts):
            return self.table
        ranges = [self.parts[d] for d in digests]
        starts = np.array([at for at, _ in ranges], dtype=np.int64)
        counts = np.array([n for _, n in ranges], dtype=np.int64)
        ends = np.cumsum(counts)
        at = np.arange(int(ends[-1]) if len(ends) else 0, dtype=np.int64) + np.repeat(starts - (ends - counts), counts)
        return self.table.take(pa.array(at, pa.int64()))


_LOADED: dict[Path, Loaded] = {}
_LOCK = threading.Lock()


def loaded(path: Path) -> Loaded | None:
    """The rows file ``path`` (read again only when it changed; None: none, or not a rows file)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    stamp = (st.st_size, st.st_mtime_ns, st.st_ino)
    found = _LOADED.get(path)
    if found is not None and found.stamp == stamp:
        return found
    found = _read(path, stamp)
    with _LOCK:
        if found is None:
            _LOADED.pop(path, None)
        else:
            _LOADED[path] = found
    return found


def _read(path: Path, stamp: tuple[int, int, int]) -> Loaded | None:
    try:
        table = pa.ipc.open_file(pa.py_buffer(path.read_bytes())).read_all()
        meta = json.loads((table.schema.metadata or {})[PARTS_KEY])
        base, where = str(meta["base"]), meta["parts"]
        table = table.replace_schema_metadata(None).combine_chunks()
        parts = {str(k): (int(at), int(n)) for k, (at, n) in where.items()}
        if any(at < 0 or n < 0 or at + n > table.num_rows for at, n in parts.values()):
            raise ValueError("a conversation's rows lie outside the file")
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException) as e:  # a damaged file: computed instead
        logger.info("%s is not read: %s", path, e)
        return None
    return Loaded(stamp, base, table, parts)


def save(data: Path, query: str, base: str, columns: pa.Schema, parts: dict[str, pa.Table]) -> bool:
    """Write the rows of each conversation (by its key's digest) of a query whose keys share ``base``, atomically;
    False when the store may not be written (a read-only mount: the readers compute them)."""
    names = sorted(parts)
    where, at = {}, 0
    for k in names:
        where[k] = [at, parts[k].num_rows]
        at += parts[k].num_rows
    meta = {PARTS_KEY: json.dumps({"base": base, "parts": where}).encode()}
    tables = [parts[k].cast(columns) for k in names]
    table = (pa.concat_tables(tables).combine_chunks() if tables else columns.empty_table())  # one compact chunk
    table = table.replace_schema_metadata(meta)
    path = rows_path(data, query)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        tmp.replace(path)
    except OSError as e:
        logger.info("%s not written: %s", path, e)
        return False
    return True


_TOUCHED: dict[Path, float] = {}


def want(data: Path, query: str, name: str, values: dict[str, object]) -> None:
    """Say that a reader asks ``name`` with ``values`` (``query``: their digest): touch its ``.want`` file (written
    when missing) at most every ``TOUCH_SECONDS``. Values JSON does not give back as they are: not said."""
    path = state_dir(data) / DIR / f"{query}.want"
    now = time.monotonic()
    if now - _TOUCHED.get(path, -TOUCH_SECONDS) < TOUCH_SECONDS:
        return
    _TOUCHED[path] = now
    try:
        os.utime(path)
        return
    except FileNotFoundError:
        pass
    except OSError:
        return
    try:
        text = json.dumps({"name": name, "values": values})
    except (TypeError, ValueError):
        return
    if repr(sorted(json.loads(text)["values"].items())) != repr(sorted(values.items())):
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except OSError as e:
        logger.info("%s not written: %s", path, e)


def wanted(data: Path, within: float = WANT_SECONDS) -> list[tuple[str, dict[str, object]]]:
    """The queries (name, values) a reader asked about within ``within`` seconds, sorted; the older ``.want`` files
    and their rows files are removed."""
    folder = state_dir(data) / DIR
    found = []
    now = time.time()
    for path in sorted(folder.glob("*.want")) if folder.is_dir() else ():
        try:
            if now - path.stat().st_mtime > within:
                path.unlink(missing_ok=True)
                rows_path(data, path.stem).unlink(missing_ok=True)
                continue
            doc = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(doc, dict) and isinstance(doc.get("name"), str) and isinstance(doc.get("values"), dict):
                found.append((doc["name"], doc["values"]))
        except (OSError, ValueError):
            continue
    return found


def forget() -> None:
    """Forget the files read and the touches (tests, ``bench/poll.py``)."""
    with _LOCK:
        _LOADED.clear()
        _TOUCHED.clear()
