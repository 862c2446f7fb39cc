"""Each trace's newest stored round, kept per listing of the stored rounds' state files.

A whole-store read of a materialized named query takes, of each trace, the rows of the newest round of
its latest build. Joining the state's rows (``materialized_traces``, one per trace and round) on the
latest builds each time cost ~110 ms CPU on 1M spans, more than the rest of a poll. The newest state row
of each trace (its build, round and the signature that round saw) depends on the state files alone, and
a published file never changes (a round or a collection writes new names): so it is computed once per
listing of those files (names, sizes, modification times), by the first reader that needs it or by the round that wrote the listing
(``advance``), and kept as ``<data>/state/materialized/current-<digest of the listing>.parquet`` (the
tables of older listings are removed). ``freshness.freshness`` counts a trace whose latest build is not
its newest stored row's build as not answered, so the rows a reader takes through it are those of the
newest round of each answered trace's latest build.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from tracedag.pipeline.store import freshkept
from tracedag.pipeline.store.cachereads import local_copies, native_reads
from tracedag.pipeline.store.files import parquet_files
from tracedag.pipeline.store.listing import source_uris
from tracedag.pipeline.store.remote import binding

if TYPE_CHECKING:
    import duckdb

logger = logging.getLogger(__name__)

STATE = "materialized_traces"  # materialized.STATE (that module imports this one)
KEPT = "materialized"  # freshness.KEPT: <data>/state/materialized/
RELATION = "__tracedag_current"
"""The name a reader registers the kept table under on its connection (``materialized.reader_sql``'s ``current``)."""
COLUMNS = ("trace_id", "build_id", "mat_round", "signature")
_SCHEMA = pa.schema([("trace_id", pa.string()), ("build_id", pa.string()), ("mat_round", pa.int64()),
                     ("signature", pa.string())])
_DICTIONARY = ("build_id", "signature")
"""Columns of few distinct values, read as dictionaries (87k signatures as strings took 40% of a read)."""

ROW_GROUP = 16 * 1024
"""Rows a kept table's row group holds: ``lookup`` reads the one whose trace id statistics can hold the trace."""

_NEWEST_SQL = """
select trace_id, arg_max(build_id, mat_round) as build_id, max(mat_round) as mat_round,
       arg_max(signature, mat_round) as signature
from {source} group by trace_id order by trace_id
"""


@dataclass(frozen=True)
class Current:
    """The newest state row of each stored trace (``COLUMNS``, by trace id) for the state files ``listing``."""

    table: pa.Table
    listing: tuple[str, ...]


def listing(data: Path) -> tuple[str, ...]:
    """The state files of ``data`` now: what the kept table is for. Each is its path, with its size and
    modification time when it is here (a file rewritten in place under its name counts as another file)."""
    return tuple(_stamp(f) for f in parquet_files(data, STATE))


_STAMP_SEP = "\x1f"


def _stamp(f: Path) -> str:
    try:
        st = f.stat()
    except OSError:  # published by another writer to an object store (its bytes never change), or just removed
        return str(f)
    return f"{f}{_STAMP_SEP}{st.st_size}{_STAMP_SEP}{st.st_mtime_ns}"


def _files(names: tuple[str, ...]) -> list[Path]:
    return [Path(n.split(_STAMP_SEP, 1)[0]) for n in names]


def _path(data: Path, names: tuple[str, ...]) -> Path:
    digest = hashlib.sha256("\0".join((str(data), *names)).encode()).hexdigest()[:32]
    return data / "state" / KEPT / f"current-{digest}.parquet"


_LAST: dict[str, Current] = {}
"""The table this process read or computed last, per store (a server or a poller asks again and again)."""


def newest(con: duckdb.DuckDBPyConnection, data: Path) -> Current | None:
    """The newest state row of each trace for the state files of ``data`` now: kept, else computed on ``con``
    (any connection over the store: the files are read by name) and kept. None when no round is stored."""
    names = listing(data)
    if not names:
        return None
    last = _LAST.get(str(data))
    if last is not None and last.listing == names:
        return last
    table = _read(_path(data, names))
    if table is None:
        table = _shared(con, data, names)
    _LAST[str(data)] = Current(table, names)
    return _LAST[str(data)]


PUBLISHED = "state/materialized-current.parquet"
"""On an object store, the object under its root holding the newest table a reader computed, with the digest of the
store's state files it is for (``_DIGEST``): a fresh work directory takes it with one GET instead of reading the
state files (~25 ms CPU with keeping it); one for another listing (a new round, a collection, a store wiped and
written again: new file names) is not taken. Last writer wins; a reader that cannot write the store keeps its own."""
_DIGEST = b"tracedag.current.digest"


def _shared(con: duckdb.DuckDBPyConnection, data: Path, names: tuple[str, ...]) -> pa.Table:
    """The table for ``names`` no process kept here: the store's published one when it is for these files, else
    computed on ``con``; kept here, and (computed, on an object store) published for the other work directories."""
    bound = binding(data)
    found = None if bound is None else _store_digest(data, bound[0].url, names)
    raw = None if bound is None or found is None else freshkept.get(bound[0], PUBLISHED)
    table = None if raw is None or found is None else _published_table(raw, found)
    if table is not None and raw is not None:
        _keep(data, names, lambda tmp: tmp.write_bytes(raw))
        return table
    table = _compute(con, data, names)
    if found is not None:
        table = table.replace_schema_metadata({_DIGEST: found.encode()})
    if keep(data, names, table) and bound is not None and found is not None:
        freshkept.put(bound[0], PUBLISHED, _path(data, names).read_bytes())
    return table


def _store_digest(data: Path, url: str, names: tuple[str, ...]) -> str | None:
    """The digest of the state files ``names`` by their names in the store (the same in every work directory)."""
    store = freshkept.store_names(data, _files(names))
    if store is None:
        return None
    return hashlib.sha256("\0".join((url, ",".join(COLUMNS), *store)).encode()).hexdigest()[:32]


def _published_table(raw: bytes, digest: str) -> pa.Table | None:
    """The published table ``raw`` when it is for ``digest`` and has the kept table's columns (None: it is not)."""
    try:
        with pq.ParquetFile(pa.BufferReader(raw), read_dictionary=list(_DICTIONARY)) as kept:
            if (kept.schema_arrow.metadata or {}).get(_DIGEST) != digest.encode():
                return None
            table = kept.read()
    except (OSError, pa.ArrowInvalid):  # a damaged object: computed instead
        return None
    return table if tuple(table.column_names) == COLUMNS else None


def lookup(data: Path, trace_id: str) -> int | None:
    """The newest stored round of ``trace_id`` for the state files now, from the table kept for them (this
    process's, else the file's one row group that can hold it); None: no table kept, or no row of the trace."""
    names = listing(data)
    last = _LAST.get(str(data))
    if last is not None and last.listing == names:
        table = last.table
    else:
        found = _group_of(_path(data, names), trace_id)
        if found is None:
            return None
        table = found
    import pyarrow.compute as pc  # here: the SQL workers and servers that import this module seldom need it (~40 ms)

    i = pc.index(table.column("trace_id"), trace_id).as_py()
    return None if i < 0 else int(table.column("mat_round")[i].as_py())


def _group_of(path: Path, trace_id: str) -> pa.Table | None:
    """The ``trace_id`` and ``mat_round`` of the kept table's row group whose statistics can hold ``trace_id``
    (an empty table when none can; None when no table is kept). Read by its footer, without pyarrow's dataset
    filters, which cost ~100 ms CPU to import in a new process."""
    try:
        pf = pq.ParquetFile(path)
        meta = pf.metadata
        for g in range(meta.num_row_groups):
            stats = meta.row_group(g).column(0).statistics  # trace_id, the first column
            if stats is None or not stats.has_min_max or stats.min <= trace_id <= stats.max:
                return pf.read_row_group(g, columns=["trace_id", "mat_round"])
    except (OSError, pa.ArrowInvalid):  # none kept for this listing
        return None
    return pa.table({"trace_id": pa.array([], pa.string()), "mat_round": pa.array([], pa.int64())})


def register(con: duckdb.DuckDBPyConnection, data: Path) -> Current | None:
    """``newest`` registered on ``con`` as ``RELATION`` (None: no round stored, nothing registered)."""
    current = newest(con, data)
    if current is not None:
        con.register(RELATION, current.table)
    return current


def _read(path: Path) -> pa.Table | None:
    """The table kept at ``path`` (None: none kept). Read by ``ParquetFile``: ``pq.read_table`` imports pyarrow's
    dataset module (~10-20 ms CPU in a fresh process), even to find no file."""
    try:
        with pq.ParquetFile(path, read_dictionary=list(_DICTIONARY)) as kept:
            table = kept.read()
    except (OSError, pa.ArrowInvalid):  # none kept for this listing (or a half-written one of a crash)
        return None
    return table if tuple(table.column_names) == COLUMNS else None


def _compute(con: duckdb.DuckDBPyConnection, data: Path, names: tuple[str, ...]) -> pa.Table:
    """The newest state row of each trace, from exactly the files of ``names`` (not the view's, which may differ);
    on an object store, from the local object cache's complete copies where it has them (``local_copies``)."""
    with native_reads(con, [STATE]):
        found = local_copies(data, source_uris(data, _files(names)))
    uris = ", ".join("'" + u.replace("'", "''") + "'" for u in found)
    source = f"read_parquet([{uris}], union_by_name = true, hive_partitioning = false)"
    table: pa.Table = con.sql(_NEWEST_SQL.format(source=source)).to_arrow_table()
    return table.select(list(COLUMNS)).cast(_SCHEMA)


def keep(data: Path, names: tuple[str, ...], table: pa.Table) -> bool:
    """Keep ``table`` as the newest state rows for the listing ``names``; remove the tables of older listings.
    A path with no store or a store this process may not write to keeps nothing (False)."""
    return _keep(data, names, lambda tmp: pq.write_table(table, tmp, compression="zstd", row_group_size=ROW_GROUP))


def _keep(data: Path, names: tuple[str, ...], write: Callable[[Path], object]) -> bool:
    """``keep`` of the file ``write`` writes (given its temporary path)."""
    path = _path(data, names)
    if not (data / "tables").is_dir():
        return False
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        write(tmp)
        tmp.replace(path)
        for old in path.parent.glob("current-*.parquet"):
            if old != path:
                old.unlink(missing_ok=True)
    except OSError as e:
        logger.info("the current rounds are not kept on disk: %s", e)
        return False
    return True


def advance(data: Path, before: tuple[str, ...], state: pa.Table) -> bool:
    """After a round wrote the state rows ``state`` (one file), keep the table of the new listing from the one of
    ``before`` (the listing before the round) without reading every state file: each trace of ``state`` takes
    its row. Does nothing (False) when no table is kept for ``before`` or the listing changed otherwise
    meanwhile (a collection): the next reader computes it then."""
    now = listing(data)
    if len(now) != len(before) + 1 or not set(before) <= set(now):
        return False
    old = _read(_path(data, before)) if before else _SCHEMA.empty_table()
    if old is None:
        return False
    import pyarrow.compute as pc

    rows = state.select(list(COLUMNS)).cast(_SCHEMA)
    kept = old.cast(_SCHEMA).filter(pc.invert(pc.is_in(old.column("trace_id"), value_set=rows.column("trace_id"))))
    both = pa.concat_tables([kept, rows])
    return keep(data, now, both.sort_by("trace_id"))
