"""What the last build plan saw, so that the next one reads only the spans files written since.

A plan needs, for every trace that may be due, when its spans arrived: the last one (is the trace
quiet yet?), whether its root span is in, and the first one (how far back its build must read).
Scanning every spans file for that each round made a live round grow with the store (0.35 s of
plan and 0.4 s of read at 800k spans, every second). Instead, ``<data>/state/build-window/`` keeps

- ``seen.json``: the spans files (``recv_hour=H/name``) the last plan read or accounted for;
- ``open.arrow``: the arrival figures (``OPEN_SCHEMA``) of the open traces: the ones still
  pending, and the ones built less than ``RETAIN_NS`` ago (a late span to such a trace is rebuilt
  reading only the files from its first arrival on).

An incremental plan reads the converters' files it has not seen (each is written once, and every
row in it is a span that arrived since) and merges their figures with the open ones; a trace with a row there has
changed. A compaction's merged file (``compact-*``) holds only spans of the files it merged, which
its footer lists (``MERGED_FROM_KEY``): when all of them were seen, it brings nothing new. Anything
else (a merged file with an input never seen, a file of unknown origin, no state, other settings)
makes the plan a full one, as every plan used to be. A trace met in a new file but not open (a
late span to a trace built long ago) has no known first arrival: its build reads every file.
Both state files are written after the build's own files: a crash makes the next plan read the
same new files again.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tracedag.pipeline.store.files import parquet_files
from tracedag.schemas.layout import MERGED_FROM_KEY, state_file, table_dir

logger = logging.getLogger(__name__)

RETAIN_NS = 60 * 10**9
"""How long a built trace stays open (its first arrival known) after its last span arrived."""

OPEN_SCHEMA = pa.schema([
    pa.field("trace_id", pa.string()),
    pa.field("n", pa.int64()),  # rows read for it so far (a sizing figure: duplicates count)
    pa.field("first_received", pa.int64()),
    pa.field("last_received", pa.int64()),
    pa.field("last_live", pa.int64()),  # last arrival from a live export (0: only from files)
    pa.field("root_received", pa.int64()),  # arrival of its root span (0: not in yet)
    pa.field("built", pa.bool_()),  # built since its last arrival
])

_DIR = "build-window"
MERGED_PREFIX = "compact-"  # a compaction's merged files; every other spans file is written once by a converter


def relative(data: Path, path: Path) -> str:
    """A spans file's name in ``seen``: ``recv_hour=H/name`` (or the path under the table)."""
    return path.relative_to(table_dir(data, "spans")).as_posix()


@dataclass
class Window:
    """The seen files and the open traces of the last plan."""

    seen: set[str] = field(default_factory=set)
    open: pa.Table = field(default_factory=OPEN_SCHEMA.empty_table)


@dataclass(frozen=True)
class NewFiles:
    """The spans files a plan must read, or why it must read all of them."""

    fresh: list[Path]
    full_reason: str | None  # set: this plan is a full one


def load_window(data: Path) -> Window | None:
    """The state of the last plan, or None when there is none (or it cannot be read)."""
    d = state_file(data, _DIR)
    try:
        seen = json.loads((d / "seen.json").read_text(encoding="utf-8"))
        with pa.memory_map(str(d / "open.arrow")) as source:
            table = pa.ipc.open_file(source).read_all()
    except (OSError, ValueError, pa.ArrowInvalid):
        return None
    if not isinstance(seen, list) or not table.schema.equals(OPEN_SCHEMA):
        return None
    return Window(set(map(str, seen)), table)


def save_window(data: Path, window: Window) -> None:
    """Write the state atomically (each file replaced whole; a torn pair is caught by ``files``)."""
    d = state_file(data, _DIR)
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / "open.arrow.tmp"
    with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, OPEN_SCHEMA) as writer:
        writer.write_table(window.open.cast(OPEN_SCHEMA))
    os.replace(tmp, d / "open.arrow")
    tmp = d / "seen.json.tmp"
    tmp.write_text(json.dumps(sorted(window.seen)), encoding="utf-8")
    os.replace(tmp, d / "seen.json")


def clear_window(data: Path) -> None:
    """Forget the state (the next plan is a full one)."""
    d = state_file(data, _DIR)
    for name in ("seen.json", "open.arrow"):
        (d / name).unlink(missing_ok=True)


def spans_listing(data: Path) -> list[Path]:
    """The spans files now: what a plan and the build after it read."""
    return parquet_files(data, "spans")


def new_files(data: Path, listing: list[Path], window: Window | None) -> NewFiles:
    """Sort the files of ``listing`` not in ``window.seen``: fresh ones to read, or a reason for a full plan."""
    if window is None:
        return NewFiles([], "no state of an earlier plan")
    fresh: list[Path] = []
    for path in listing:
        name = relative(data, path)
        if name in window.seen:
            continue
        if not path.name.startswith(MERGED_PREFIX):
            fresh.append(path)
            continue
        reason = _merged_unseen(path, name, window.seen)
        if reason is not None:
            return NewFiles([], reason)
    return NewFiles(fresh, None)


def _merged_unseen(path: Path, name: str, seen: set[str]) -> str | None:
    """None when ``path`` is a merged file of seen files only; else why a full plan is needed."""
    try:
        meta = pq.read_schema(path).metadata or {}
    except (OSError, pa.ArrowInvalid):
        return f"{path.name} could not be read"
    raw = meta.get(MERGED_FROM_KEY)
    if raw is None:
        return f"{path.name} is of unknown origin"
    folder = name.rpartition("/")[0]
    unseen = [n for n in json.loads(raw) if (f"{folder}/{n}" if folder else str(n)) not in seen]
    if unseen:
        return f"{path.name} merged {len(unseen)} file(s) no plan saw"
    return None
