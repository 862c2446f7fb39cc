"""Span de-duplication on ``(trace_id, span_id)``: first write wins.

Each stored span is represented by two 64-bit numbers: its *key* (a hash of trace and span id)
and its *content hash* (a hash of the span's serialized protobuf). The index keeps the keys of
the spans stored in the last ``window_hours`` receive hours as sorted numpy runs (16 bytes a
span in the files, 12 bytes in memory: about 12 MB per million spans). Every spans Parquet file has a sidecar
``<file>.keys.npy`` (not ``*.parquet``, so readers never see it) with the keys and content
hashes of its rows, written right after the Parquet rename; at startup the index is rebuilt
from the sidecars of the window, and a Parquet file whose sidecar is missing (crash between
the two renames) gets its keys back from its id columns (content hash 0 = unknown).

A span whose key is already indexed is dropped; if its content hash differs (and neither is
unknown) it also counts as a conflict. Two different spans sharing a 64-bit key would be
wrongly dropped: with 10^8 spans in the window the probability is about 3e-4.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

logger = logging.getLogger(__name__)

SIDECAR_SUFFIX = ".keys.npy"

DEFAULT_MAX_KEYS = 1_000_000
"""Most keys an index holds (12 MB; each converter process holds one); the oldest runs are
forgotten beyond it, and compaction still de-duplicates within a receive hour. A lost ack is
retried after the exporter's timeout (10 s by default) plus its backoff: 1M spans cover that at
40k spans/s (25 s) and 5 hours at 55 spans/s. 2M keys cost each converter 12 MB more, which put
the collector's memory under overload over its 400 MB budget."""

RUNS_PER_INDEX = 8
"""Runs are merged up to ``max_keys / RUNS_PER_INDEX`` keys (an index searches ~2-3x as many runs)."""
MIN_RUN_CAP = 65_536

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLD = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer, vectorized (uint64 arithmetic wraps)."""
    with np.errstate(over="ignore"):
        x = x + _GOLD
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
        out: np.ndarray = x ^ (x >> np.uint64(31))
        return out


def keys_from_ids(trace_ids: bytes, span_ids: bytes, n: int) -> np.ndarray:
    """Return the 64-bit keys of ``n`` spans from their concatenated 16-byte and 8-byte ids."""
    t = np.frombuffer(trace_ids, dtype=">u8").astype(np.uint64).reshape(n, 2)
    s = np.frombuffer(span_ids, dtype=">u8").astype(np.uint64)
    return _mix(_mix(_mix(t[:, 0]) ^ t[:, 1]) ^ s)


def keys_from_hex(trace_hex: pa.Array | pa.ChunkedArray, span_hex: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Return the keys of spans given hex id columns (any id length; fast path for valid ids)."""
    tl, sl = trace_hex.to_pylist(), span_hex.to_pylist()
    n = len(tl)
    if all(len(x) == 32 for x in tl) and all(len(x) == 16 for x in sl):
        return keys_from_ids(bytes.fromhex("".join(tl)), bytes.fromhex("".join(sl)), n)
    out = np.empty(n, dtype=np.uint64)
    for i, (t, s) in enumerate(zip(tl, sl, strict=True)):
        out[i] = xxhash.xxh3_64_intdigest(f"{t}/{s}".encode())
    return out


def first_occurrence(keys: np.ndarray) -> np.ndarray:
    """Return a boolean mask keeping the first row of each key (in row order)."""
    _, idx = np.unique(keys, return_index=True)
    mask = np.zeros(len(keys), dtype=bool)
    mask[idx] = True
    return mask


@dataclass
class DedupeResult:
    """Which rows of a batch to keep, and how many were duplicates / conflicts."""

    keep: np.ndarray
    duplicates: int
    conflicts: int


class DedupeIndex:
    """Keys and content hashes of the spans stored in the recent receive-hour window."""

    def __init__(self, window_hours: int = 48, max_keys: int = DEFAULT_MAX_KEYS, run_cap: int | None = None) -> None:
        self.window_hours = window_hours
        self.max_keys = max_keys
        self._runs: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
        self._size = 0
        self.run_cap = run_cap or max(MIN_RUN_CAP, max_keys // RUNS_PER_INDEX)

    def __len__(self) -> int:
        return self._size

    def add(self, hour: str, keys: np.ndarray, content: np.ndarray) -> None:
        """Index the keys of rows just stored in partition ``hour``; drop hours out of the window."""
        if not len(keys):
            return
        order = np.argsort(keys, kind="stable")
        runs = self._runs.setdefault(hour, [])
        runs.append((keys[order], _fold(content)[order]))
        self._size += len(keys)
        _merge_tail(runs, self.run_cap)
        self._evict()

    def _evict(self) -> None:
        hours = sorted(self._runs)
        for h in hours[: max(0, len(hours) - self.window_hours)]:
            self._size -= sum(len(k) for k, _ in self._runs.pop(h))
        while self._size > self.max_keys and len(self._runs) > 0:
            oldest = min(self._runs)
            runs = self._runs[oldest]
            if len(runs) == 1 and len(self._runs) == 1:
                return  # never forget the newest run
            self._size -= len(runs.pop(0)[0])
            if not runs:
                del self._runs[oldest]

    def check(self, keys: np.ndarray, content: np.ndarray) -> DedupeResult:
        """Return which rows to keep: first in the batch and not already indexed."""
        keep = first_occurrence(keys)
        conflicts = _batch_conflicts(keys, content, keep)
        order = np.argsort(keys)  # sorted needles: each binary search starts near the last (3x fewer cache misses)
        sk, sc, skeep = keys[order], _fold(content)[order], keep[order]
        for runs in self._runs.values():
            for rk, rc in runs:
                if not len(rk):
                    continue
                pos = np.searchsorted(rk, sk)
                pos[pos >= len(rk)] = 0
                hit = rk[pos] == sk
                differ = hit & skeep & (rc[pos] != sc) & (rc[pos] != 0) & (sc != 0)
                conflicts += int(differ.sum())
                skeep &= ~hit
        keep[order] = skeep
        return DedupeResult(keep, int(len(keys) - keep.sum()), conflicts)

    def load_dir(self, table_root: Path) -> list[Path]:
        """Rebuild from the spans files of the newest ``window_hours`` partitions; return the files read."""
        return self.load_new(table_root, set())

    def load_new(self, table_root: Path, known: set[Path]) -> list[Path]:
        """Index the spans files of the window not in ``known``; return them.

        Only the newest files whose keys fit in ``max_keys`` are read (oldest of those first): a
        writer reloads after every compaction, and reading every sidecar of 48 hours to keep the
        newest million keys cost minutes of CPU per hour of history at high rates. The older files
        are returned too, as known: they would only be forgotten again.
        """
        parts = sorted(p for p in table_root.glob("recv_hour=*") if p.is_dir())
        files = [f for part in parts[-self.window_hours :] for f in sorted(part.glob("*.parquet")) if f not in known]
        files.sort(key=lambda f: (f.parent.name, _mtime(f)))
        newest: list[Path] = []
        total = 0
        for f in reversed(files):
            if total >= self.max_keys:
                break
            newest.append(f)
            total += _rows(f)
        for f in reversed(newest):
            keys, content = read_sidecar(f)
            self.add(f.parent.name.split("=", 1)[1], keys, content)
        return files


def _fold(content: np.ndarray) -> np.ndarray:
    """64-bit content hashes folded to 32 bits for the index (12 bytes a span, not 16; 0 stays unknown)."""
    c = content.astype(np.uint64, copy=False)
    folded: np.ndarray = (c ^ (c >> np.uint64(32))).astype(np.uint32)
    return folded


def _merge_tail(runs: list[tuple[np.ndarray, np.ndarray]], cap: int) -> None:
    """Merge the newest runs while the one before is at most twice the newest's size and the
    merged run would hold at most ``cap`` keys.

    Like a binary counter: each key takes part in O(log n) merges (re-sorting the whole hour
    every few batches cost ~4 µs a span at 4M keys), and an hour keeps O(log n) runs to search.
    The cap bounds the memory a merge needs beside the index (merging two 1M-key runs needed
    ~40 MB more for a moment) and lets eviction forget the oldest keys a run at a time.
    """
    while len(runs) >= 2 and len(runs[-2][0]) <= 2 * len(runs[-1][0]) and len(runs[-2][0]) + len(runs[-1][0]) <= cap:
        runs[-2:] = [_merge(runs[-2], runs[-1])]


def _merge(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Merge two sorted runs in linear time and little extra memory (``a``'s equal keys first)."""
    (ka, ca), (kb, cb) = a, b
    at = np.searchsorted(ka, kb, side="right") + np.arange(len(kb))
    from_b = np.zeros(len(ka) + len(kb), dtype=bool)
    from_b[at] = True
    keys = np.empty(len(from_b), dtype=ka.dtype)
    content = np.empty(len(from_b), dtype=ca.dtype)
    keys[from_b], content[from_b] = kb, cb
    keys[~from_b], content[~from_b] = ka, ca
    return keys, content


def _rows(parquet: Path) -> int:
    """Rows of a spans file, from its sidecar's header (or the Parquet footer without one)."""
    try:
        return int(np.load(sidecar_path(parquet), mmap_mode="r").shape[-1])
    except (OSError, ValueError):
        try:
            return int(pq.ParquetFile(parquet).metadata.num_rows)
        except OSError:
            return 0


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def _batch_conflicts(keys: np.ndarray, content: np.ndarray, keep: np.ndarray) -> int:
    """Count dropped in-batch duplicates whose content differs from the kept row with that key."""
    if keep.all():
        return 0
    first = {int(k): int(c) for k, c in zip(keys[keep], content[keep], strict=True)}
    return sum(1 for k, c in zip(keys[~keep], content[~keep], strict=True) if first[int(k)] != int(c))


def sidecar_path(parquet: Path) -> Path:
    """Return the key sidecar path of a spans Parquet file."""
    return parquet.with_name(parquet.name[: -len(".parquet")] + SIDECAR_SUFFIX)


def write_sidecar(parquet: Path, keys: np.ndarray, content: np.ndarray) -> None:
    """Atomically write the keys and content hashes of ``parquet``'s rows beside it."""
    final = sidecar_path(parquet)
    tmp = final.with_name(final.name + ".tmp")
    with open(tmp, "wb") as fh:
        np.save(fh, np.stack([keys, content]))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, final)


def read_sidecar(parquet: Path) -> tuple[np.ndarray, np.ndarray]:
    """Return (keys, content hashes) of a spans file, from its sidecar or, failing that, its ids."""
    side = sidecar_path(parquet)
    try:
        arr = np.load(side)
        return arr[0].astype(np.uint64), arr[1].astype(np.uint64)
    except (OSError, ValueError, IndexError):
        logger.info("rebuilding the dedupe keys of %s from its id columns", parquet)
    t = pq.read_table(parquet, columns=["trace_id", "span_id"])
    keys = keys_from_hex(t.column("trace_id"), t.column("span_id"))
    return keys, np.zeros(len(keys), dtype=np.uint64)
