"""Which Parquet files of a table may hold a trace (#31 traces by id): the trace id filters of each file's row
groups, read once per file for the server's life.

A trace's read named the table's view, so DuckDB parsed the footer of every file of the table on each new
connection (a new Store, every new build state): on 1M spans its 31 spans files' footers cost ~50 ms CPU of
a trace's first view, for the one or two files that hold the trace. Here each local file's row groups are
kept in memory as their ``trace_id`` min/max and Bloom filter (``store.parquet.TRACE_BLOOM``, written since
#31), keyed by the file's path, size and modification time (a published file never changes under its name;
a rewritten one has another size or time), and a read names only the files where a row group may hold the
trace: ``read_parquet([...])`` of those, whose footers DuckDB parses, and which it prunes as before.

The filters read are kept on disk too, ``state/trace_files/<table>.arrow`` (Arrow IPC: a row per row group
with its file's path under the table, size and mtime), rewritten when a read met a file not kept there, so
that a server just started reads that one small file instead of every footer (a store this process may not
write to keeps nothing; an unreadable kept file is ignored).

A row group with neither statistics nor a filter may hold any trace. Bloom filters are Parquet's split block
filters (xxHash64 of the value, seed 0); one whose header is not understood may hold any trace too. An object
store's tables are read through their views as before (``sources`` names the view).
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import xxhash
from pyarrow import ipc

from tracedag.pipeline.store.remote import remote_of
from tracedag.schemas.layout import state_dir, table_dir

logger = logging.getLogger(__name__)

CACHE_BYTES = 32 << 20
"""Budget of the kept row group filters (spans: ~5.5 KB a file of 32k rows; 31 files of 1M spans ~170 KB)."""

_SALT = (0x47B6137B, 0x44974D91, 0x8824AD5B, 0xA2B7289D, 0x705495C7, 0x2DF1424B, 0x9EFC4947, 0x5C6BFB31)
"""The split block Bloom filter's eight salts (Parquet format, BloomFilter.md)."""
_BLOCK = 32
_READ_AT_ONCE = 4 << 20
"""A file's Bloom filters are read in one piece when they lie within this many bytes (pyarrow writes them
together), else one by one."""


@dataclass(frozen=True)
class Group:
    """One row group's ``trace_id`` filter: min/max (None: not written) and the Bloom filter's bitset (None: none)."""

    low: str | None
    high: str | None
    bits: bytes | None

    def may_hold(self, trace_id: str, key: int) -> bool:
        """Whether a row of ``trace_id`` (``key``: its xxHash64) may be in the row group."""
        if self.low is not None and self.high is not None and not self.low <= trace_id <= self.high:
            return False
        return self.bits is None or bloom_may_hold(self.bits, key)


def bloom_may_hold(bits: bytes, key: int) -> bool:
    """Whether a split block Bloom filter's bitset may hold the value whose xxHash64 is ``key``."""
    blocks = len(bits) // _BLOCK
    start = (((key >> 32) * blocks) >> 32) * _BLOCK
    low = key & 0xFFFFFFFF
    for i, salt in enumerate(_SALT):
        word = int.from_bytes(bits[start + 4 * i : start + 4 * i + 4], "little")
        if not (word >> (((low * salt) & 0xFFFFFFFF) >> 27)) & 1:
            return False
    return True


def trace_key(trace_id: str) -> int:
    """The Bloom filter hash of a trace id (xxHash64, seed 0, of its bytes as Parquet stores them)."""
    return int(xxhash.xxh64_intdigest(trace_id.encode()))


def bitset(blob: bytes) -> bytes | None:
    """The bitset of a Bloom filter as stored (a Thrift compact ``BloomFilterHeader``, then the bitset), None
    when its header is not the one expected (numBytes first, a whole number of blocks, within the blob)."""
    if len(blob) < 2 or blob[0] != 0x15:  # field 1 (numBytes), i32
        return None
    value, shift, i = 0, 0, 1
    while i < len(blob) and shift < 35:
        byte = blob[i]
        value |= (byte & 0x7F) << shift
        i += 1
        shift += 7
        if not byte & 0x80:
            size = (value >> 1) ^ -(value & 1)  # zigzag
            ok = 0 < size <= len(blob) - i and size % _BLOCK == 0
            return bytes(blob[len(blob) - size :]) if ok else None
    return None


def _trace_column(meta: pq.FileMetaData) -> int | None:
    for i in range(meta.num_columns):
        if meta.schema.column(i).path == "trace_id":
            return i
    return None


def _filters(path: Path, meta: pq.FileMetaData, column: int) -> list[bytes | None]:
    """The Bloom filter bitset of each row group's ``column`` (None: none written, or not understood)."""
    spans = []
    for g in range(meta.num_row_groups):
        c = meta.row_group(g).column(column)
        offset, length = c.bloom_filter_offset, c.bloom_filter_length
        spans.append((offset, length) if offset is not None and length else None)
    present = [s for s in spans if s is not None]
    if not present:
        return [None] * len(spans)
    first, last = min(o for o, _ in present), max(o + n for o, n in present)
    with open(path, "rb") as fh:
        if last - first <= _READ_AT_ONCE:
            fh.seek(first)
            whole = fh.read(last - first)
            blobs = [None if s is None else whole[s[0] - first : s[0] - first + s[1]] for s in spans]
        else:
            blobs = []
            for s in spans:
                if s is not None:
                    fh.seek(s[0])
                blobs.append(None if s is None else fh.read(s[1]))
    return [None if b is None else bitset(b) for b in blobs]


def _stat(value: object) -> str | None:
    return value if isinstance(value, str) else value.decode() if isinstance(value, bytes) else None


def read_groups(path: Path) -> tuple[Group, ...] | None:
    """The ``trace_id`` filter of each row group of ``path`` (None: the file has no ``trace_id`` column)."""
    meta = pq.read_metadata(path)
    column = _trace_column(meta)
    if column is None:
        return None
    groups = []
    for g, bits in enumerate(_filters(path, meta, column)):
        stats = meta.row_group(g).column(column).statistics
        bounded = stats is not None and stats.has_min_max
        groups.append(Group(_stat(stats.min) if bounded else None, _stat(stats.max) if bounded else None, bits))
    return tuple(groups)


class _Kept:
    """The row group filters of files, by path, with the size and mtime they were read at; bounded in bytes."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.used = 0
        self.files: OrderedDict[str, tuple[int, int, tuple[Group, ...] | None, int]] = OrderedDict()
        self.lock = threading.Lock()

    def groups(self, path: Path) -> tuple[tuple[Group, ...] | None, bool]:
        """``path``'s row group filters, and whether they were read from the file now (not kept)."""
        st = os.stat(path)  # a vanished file raises FileNotFoundError: the read is planned again
        found = self.kept(path, st.st_size, st.st_mtime_ns)
        if found is not None:
            return found[0], False
        groups = read_groups(path)
        self.keep(path, st.st_size, st.st_mtime_ns, groups)
        return groups, True

    def kept(self, path: Path, size: int, mtime_ns: int) -> tuple[tuple[Group, ...] | None] | None:
        """The filters kept for ``path`` at this size and mtime (in a 1-tuple; None: none kept)."""
        with self.lock:
            kept = self.files.get(str(path))
            if kept is None or kept[:2] != (size, mtime_ns):
                return None
            self.files.move_to_end(str(path))
            return (kept[2],)

    def keep(self, path: Path, size: int, mtime_ns: int, groups: tuple[Group, ...] | None) -> None:
        cost = 200 + sum(100 + len(g.bits or b"") for g in groups or ())
        with self.lock:
            old = self.files.pop(str(path), None)
            self.used += cost - (old[3] if old else 0)
            self.files[str(path)] = (size, mtime_ns, groups, cost)
            while self.used > self.budget and len(self.files) > 1:
                self.used -= self.files.popitem(last=False)[1][3]

    def clear(self) -> None:
        with self.lock:
            self.files.clear()
            self.used = 0
        with _LOADED_LOCK:
            _LOADED.clear()


KEPT = _Kept(CACHE_BYTES)
"""The filters this process has read (``KEPT.clear()`` forgets them, as a server just started)."""


def files_holding(files: Iterable[Path], trace_ids: list[str]) -> list[Path]:
    """The files of which a row group may hold one of ``trace_ids``."""
    return _holding(files, trace_ids)[0]


def _holding(files: Iterable[Path], trace_ids: list[str]) -> tuple[list[Path], bool]:
    """``files_holding``, and whether a file's filters were read from it (not kept)."""
    keys = [(t, trace_key(t)) for t in trace_ids]
    picked, read = [], False
    for f in files:
        groups, now = KEPT.groups(f)
        read |= now
        if groups is None or any(g.may_hold(t, k) for g in groups for t, k in keys):
            picked.append(f)
    return picked, read


KEPT_DIR = "trace_files"
_KEPT_SCHEMA = pa.schema([("file", pa.string()), ("size", pa.int64()), ("mtime_ns", pa.int64()),
                          ("group", pa.int32()), ("low", pa.string()), ("high", pa.string()), ("bits", pa.binary())])
"""A row per row group (``group`` -1: the file has no ``trace_id`` column)."""
_LOADED: dict[str, tuple[int, int]] = {}
"""The kept file of each table last loaded (path -> size, mtime): loaded again only when it changes."""
_LOADED_LOCK = threading.Lock()


def kept_path(data: Path, table: str) -> Path:
    """Where the filters of ``table``'s files are kept on disk."""
    path: Path = state_dir(data) / KEPT_DIR / f"{table}.arrow"
    return path


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def load(data: Path, table: str) -> None:
    """Keep in memory the filters kept on disk for ``table`` (when that file changed since it was loaded)."""
    path = kept_path(data, table)
    stamp = _stamp(path)
    with _LOADED_LOCK:
        if stamp is None or _LOADED.get(str(path)) == stamp:
            return
        _LOADED[str(path)] = stamp
    try:
        with ipc.open_file(path) as reader:
            rows = reader.read_all()
        if not rows.schema.equals(_KEPT_SCHEMA):
            raise ValueError(f"columns {rows.schema.names}")
    except (OSError, ValueError, pa.ArrowException) as e:
        logger.info("%s: not read (%s): the footers are read instead", path, e)
        return
    root = table_dir(data, table)
    for (name, size, mtime), groups in _by_file(rows).items():
        KEPT.keep(root / name, size, mtime, groups)


def _by_file(rows: pa.Table) -> dict[tuple[str, int, int], tuple[Group, ...] | None]:
    out: dict[tuple[str, int, int], list[Group] | None] = {}
    columns = [rows.column(name).to_pylist() for name in _KEPT_SCHEMA.names]
    for name, size, mtime, group, low, high, bits in zip(*columns, strict=True):
        key = (name, size, mtime)
        if group < 0:
            out[key] = None
            continue
        whole = bits is not None and len(bits) > 0 and len(bits) % _BLOCK == 0
        groups = out.setdefault(key, [])
        if groups is not None:
            groups.append(Group(low, high, bits if whole else None))
    return {k: None if v is None else tuple(v) for k, v in out.items()}


def save(data: Path, table: str, files: list[Path]) -> None:
    """Keep on disk the filters in memory of ``files`` (``table``'s listing), replacing what was kept."""
    root = table_dir(data, table)
    rows: dict[str, list[object]] = {name: [] for name in _KEPT_SCHEMA.names}
    for f in files:
        st = _stamp(f)
        kept = None if st is None else KEPT.kept(f, *st)
        if st is None or kept is None:
            continue
        for g, group in enumerate(kept[0] or (None,)):
            values = (str(f.relative_to(root)), *st, -1 if group is None else g, group and group.low,
                      group and group.high, group and group.bits)
            for name, value in zip(_KEPT_SCHEMA.names, values, strict=True):
                rows[name].append(value)
    path = kept_path(data, table)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with ipc.new_file(tmp, _KEPT_SCHEMA) as writer:
            writer.write_table(pa.table(rows, schema=_KEPT_SCHEMA))
        tmp.replace(path)
    except OSError as e:  # a store this process may not write to (a read-only mount): nothing kept
        tmp.unlink(missing_ok=True)
        logger.info("%s not kept on disk: %s", path, e)
        return
    stamp = _stamp(path)
    with _LOADED_LOCK:
        if stamp is not None:
            _LOADED[str(path)] = stamp


def prime(data: Path, tables: Iterable[str]) -> None:
    """Read (and keep on disk) the filters of every file of ``tables`` not kept yet: a server's warm-up, so that
    its first trace view does not read them. A file removed meanwhile (a compaction swap) leaves the rest to the
    first read."""
    try:
        sources(data, tables, [])
    except OSError as e:
        logger.info("row group filters not all read ahead: %s", e)


def read_sql(files: list[Path]) -> str:
    """``read_parquet`` of ``files`` as the tables' raw views read them (by position, no hive columns)."""
    names = ", ".join("'" + str(f).replace("'", "''") + "'" for f in files)
    return f"read_parquet([{names}], union_by_name = false, hive_partitioning = false)"


MAX_PICKED = 16
"""Most traces whose files are picked (each id is checked against every row group's filter in Python, ~3 us each:
50 traces on 1M spans' 305 row groups ~50 ms, and they are in most files anyway); more read every file."""


def sources(data: Path, tables: Iterable[str], trace_ids: list[str]) -> dict[str, str | None]:
    """For each table, what a read of ``trace_ids``' rows selects from: the files that may hold them
    (``read_sql``), None when none may; an object store's tables, or more than ``MAX_PICKED`` traces (a report's):
    their raw view (``<table>_all``)."""
    if remote_of(data) is not None or len(trace_ids) > MAX_PICKED:
        return {t: f"{t}_all" for t in tables}
    out: dict[str, str | None] = {}
    for t in tables:
        root = table_dir(data, t)
        files = sorted(root.rglob("*.parquet")) if root.is_dir() else []
        load(data, t)
        picked, read = _holding(files, trace_ids)
        if read and (data / "tables").is_dir():
            save(data, t, files)
        out[t] = read_sql(picked) if picked else None
    return out
