"""Writers' manifests on an object store: what each writer published, and how readers list the store.

``<store>/manifests/<writer>/<generation>.json`` names every file the writer has in the store, by table::

    {"writer": "collector-0", "generation": 42, "written_unix_nano": ..., "tables": {"spans": {"recv_hour=…/collector-0--part-….parquet": 51234}},
     "etags": {"spans": {"recv_hour=…/collector-0--part-….parquet": "\"9f3c…\""}}}

``etags`` (optional, added after ``tables`` so that older readers read such a manifest as before) gives the ETag the
store answered for each file just after its upload (a HEAD); a file without one (published by an older version, or
by a store that gives no ETags) has none. A reader takes a listed file's version from it (``manifest_entries``)
instead of listing the file's folder, and reads only that version (If-Match): a file overwritten in place is not
the version its manifest names, so its read fails and the reader lists its folder instead (``cachereads``).

One writer writes one manifest series, so writers never contend: a new generation is PUT (atomic) only
after the files it names are uploaded. Readers take the newest generation of every writer and union them.
A file a writer dropped (its local compaction or GC replaced it) leaves the next generation at once and
is deleted ``GRACE_SECONDS`` later, so a reader holding an older listing still finds it; old generations
are deleted the same way. This replaces the directory renames of a local store.

A work directory remembers the generation it last published. When the store's newest generation of its
writer is missing or older (the store was wiped and made again, or restored from a backup), every file
it still holds is published again under a new generation; files it no longer holds (moved out by
``KeepLocal``) that are gone from the store too make ``publish`` refuse with ``StoreLost`` instead, unless
``TRACEDAG_ACCEPT_STORE_LOSS=1`` says to go on without them.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracedag.pipeline.store.listing import (
    MANIFESTS,
    ETags,
    Tables,
    etags_of,
    forget_listing,
    generations,
    newest_manifest,
    published_name,
)
from tracedag.pipeline.store.remote import ATOMIC_PUT, Remote, binding, instance_of
from tracedag.schemas.errors import TracedagError
from tracedag.schemas.fsio import file_lock
from tracedag.schemas.layout import REPORTS, reports_dir, state_file, table_dir, tables_dir

logger = logging.getLogger(__name__)

GRACE_SECONDS = float(os.environ.get("TRACEDAG_REMOTE_GRACE", "300"))
"""How long a dropped file (and an old manifest generation) stays readable after it left the manifest."""
_STATE = "publish.json"
_LOCK = "publish.lock"
ACCEPT_LOSS = "TRACEDAG_ACCEPT_STORE_LOSS"
"""Set to 1: after a store lost files only it held, publish what the work directory has and go on."""


# ---------------------------------------------------------------- publishing


@dataclass
class PublishStats:
    """What one ``publish`` did."""

    uploaded: int = 0
    uploaded_bytes: int = 0
    deleted: int = 0
    evicted: int = 0
    generation: int | None = None
    republished: bool = False  # the store had lost this writer's manifest: everything was uploaded again
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)


def _local_tables(data: Path) -> Iterator[tuple[str, str, Path]]:
    root = tables_dir(data)
    if not root.is_dir():
        return
    for tdir in sorted(p for p in root.iterdir() if p.is_dir()):
        for f in sorted(tdir.rglob("*.parquet")):
            yield tdir.name, f.relative_to(tdir).as_posix(), f


def _load_state(data: Path) -> dict[str, Any] | None:
    try:
        raw: dict[str, Any] = json.loads(state_file(data, _STATE).read_text(encoding="utf-8"))
        return raw
    except FileNotFoundError:
        return None


def _save_state(data: Path, state: dict[str, Any]) -> None:
    path = state_file(data, _STATE)
    tmp = path.with_name(_STATE + ".tmp")
    tmp.write_text(json.dumps(state), encoding="utf-8")
    os.replace(tmp, path)


class WriterTaken(TracedagError):  # type: ignore[misc,unused-ignore]
    """Another work directory publishes under the same writer id: two would overwrite each other's manifest."""


def _check_owner(remote: Remote, writer: str, instance: str, known: bool) -> dict[str, Any] | None:
    """The writer's newest manifest, after checking this work directory owns the id."""
    found = newest_manifest(remote, writer)
    owner = None if found is None else found.get("instance")
    if found is not None and owner != instance and (known or os.environ.get("TRACEDAG_WRITER_TAKEOVER") != "1"):
        raise WriterTaken(
            f"writer id {writer!r} of {remote.url} is in use by another work directory (instance {owner}); give this "
            "one its own --writer-id/--collector-id, or set TRACEDAG_WRITER_TAKEOVER=1 once to adopt the id "
            "(its files are kept) after the old work directory was lost")
    return found


class StoreLost(TracedagError):  # type: ignore[misc,unused-ignore]
    """The store lost files this work directory published and no longer holds itself."""


def _store_lost(state: dict[str, Any], found: dict[str, Any] | None) -> bool:
    """Whether the store's newest manifest of this writer is missing or older than the one published last."""
    published = int(state.get("generation", 0))
    return published > 0 and (found is None or int(found.get("generation", 0)) < published)


def _missing_in_store(remote: Remote, retained: Tables) -> tuple[Tables, int]:
    """Split the files only the store held into those it still has, and count the ones it lost."""
    kept: Tables = {}
    lost = 0
    for table, files in retained.items():
        for name, size in files.items():
            if remote.fs.exists(remote.key(f"tables/{table}/{name}")):
                kept.setdefault(table, {})[name] = size
            else:
                lost += 1
    return kept, lost


def _refuse_if_lost(data: Path, remote: Remote, writer: str, state: dict[str, Any], found: dict[str, Any] | None
                    ) -> tuple[Tables, int]:
    """After the store lost this writer's manifest: raise ``StoreLost`` when files only the store held are
    gone too (unless ``ACCEPT_LOSS``); else return the store-only files it still has and how many it lost."""
    kept, lost = _missing_in_store(remote, state["retained"])
    if lost and os.environ.get(ACCEPT_LOSS) != "1":
        seen = "none" if found is None else f"generation {int(found.get('generation', 0))}"
        local = sum(1 for _ in _local_tables(data))
        raise StoreLost(
            f"{remote.url} no longer holds what the work directory {os.fspath(data)} published (writer {writer!r} "
            f"was at manifest generation {int(state['generation'])}, the store has {seen}); {lost} of those files "
            "were kept only in the store (moved out by --keep-local), so they are lost, and nothing was published. "
            f"To publish what the work directory holds ({local} files now) and go on without them, set "
            f"{ACCEPT_LOSS}=1 once (ingesting their sources again restores them); to start empty, use a new --work-dir")
    return kept, lost


def _after_loss(data: Path, remote: Remote, writer: str, state: dict[str, Any], found: dict[str, Any] | None
                ) -> dict[str, Any]:
    """The state that publishes every local file again (generations go on), or ``StoreLost``."""
    kept, lost = _refuse_if_lost(data, remote, writer, state, found)
    seen = "none" if found is None else f"generation {int(found.get('generation', 0))}"
    logger.warning("%s no longer holds writer %r's manifest generation %d (it has %s): publishing the %d files "
                   "of the work directory %s again%s", remote.url, writer, int(state["generation"]), seen,
                   sum(1 for _ in _local_tables(data)), os.fspath(data),
                   f"; {lost} files only the store held are lost" if lost else "")
    return {"generation": int(state["generation"]), "uploaded": {}, "retained": kept,
            "dropped": state.get("dropped", {}), "last": None, "reports": [], "etags": dict(state.get("etags", {}))}


def check_kept(data: Path) -> None:
    """Raise ``StoreLost`` now if the next ``publish`` from ``data`` would (before a command does its work).

    A store that lost only what the work directory still holds passes: ``publish`` uploads it again.
    """
    bound = binding(data)
    saved = _load_state(data)
    if bound is None or saved is None:
        return
    remote, writer = bound
    found = newest_manifest(remote, writer)
    if _store_lost(saved, found):
        _refuse_if_lost(data, remote, writer, saved, found)


def _new_state(found: dict[str, Any] | None) -> dict[str, Any]:
    """A first publish adopts what the store already lists for this writer (kept, never deleted by us)."""
    found = found or {}
    retained = {t: {str(k): int(v) for k, v in files.items()} for t, files in found.get("tables", {}).items()}
    return {"generation": int(found.get("generation", 0)), "uploaded": {}, "retained": retained,
            "dropped": {}, "last": None, "etags": etags_of(found, retained)}


def _put(remote: Remote, local: Path, key: str) -> None:
    """Upload one file; a refused or failed request is tried again (4 tries over about 4 s)."""
    for attempt in range(4):
        try:
            _put_once(remote, local, key)
            return
        except FileNotFoundError:
            raise
        except OSError:
            if attempt == 3:
                raise
            time.sleep(0.25 * 2 ** attempt)


def _put_once(remote: Remote, local: Path, key: str) -> None:
    if remote.protocol in ATOMIC_PUT:
        remote.fs.put_file(str(local), key)  # one PUT: atomic
        return
    tmp = key + ".tmp"
    remote.fs.put_file(str(local), tmp)
    remote.fs.mv(tmp, key)


def _uploaded_etag(remote: Remote, key: str) -> str | None:
    """The ETag the store gives the object just uploaded at ``key`` (a HEAD), or None (a store without ETags, or
    the HEAD failed: readers list that file's folder, as for a manifest of an older version)."""
    try:
        info = remote.fs.info(key)
    except OSError as e:
        logger.info("no ETag for %s: %s", key, e)
        return None
    etag = info.get("ETag") or info.get("etag")
    return str(etag) if etag else None


def _manifest_etags(state: dict[str, Any], tables: Tables) -> dict[str, dict[str, str]]:
    """The ``etags`` of the manifest listing ``tables``: the known ETag of each listed file (the others: none)."""
    known: ETags = state.get("etags", {})
    out: dict[str, dict[str, str]] = {}
    for table, files in tables.items():
        for name in files:
            etag = known.get(f"{table}/{name}")
            if etag:
                out.setdefault(table, {})[name] = etag
    return out


def _write_manifest(remote: Remote, writer: str, instance: str, generation: int, tables: Tables,
                    etags: dict[str, dict[str, str]] | None = None) -> None:
    content: dict[str, Any] = {"writer": writer, "instance": instance, "generation": generation,
                               "written_unix_nano": time.time_ns(), "tables": tables}
    if etags:
        content["etags"] = etags
    body = json.dumps(content, sort_keys=True).encode()
    key = remote.key(f"{MANIFESTS}/{writer}/{generation:020d}.json")
    if remote.protocol in ATOMIC_PUT:
        remote.fs.pipe_file(key, body)
        return
    remote.fs.pipe_file(key + ".tmp", body)
    remote.fs.mv(key + ".tmp", key)


def publish(data: Path, grace_seconds: float | None = None, keep_local: KeepLocal | None = None) -> PublishStats | None:
    """Upload the work directory's new Parquet files and list them in a new manifest generation.

    Returns None for a local data directory. Safe to call at any time and from several processes (a
    lock serializes them); an upload that fails leaves the file for the next call. ``keep_local``: remove
    the local copies of uploaded files of these tables once they are that old (they stay listed).
    """
    bound = binding(data)
    if bound is None:
        return None
    remote, writer = bound
    instance = instance_of(data)
    grace = GRACE_SECONDS if grace_seconds is None else grace_seconds
    stats = PublishStats()
    t0 = time.perf_counter()
    with file_lock(state_file(data, _LOCK)):
        saved = _load_state(data)
        if saved is None and next(_local_tables(data), None) is None:
            _upload_reports(data, remote, {}, stats)  # a reader (which may have saved a regress report)
            return stats  # has nothing else to publish and no manifest of its own
        found = _check_owner(remote, writer, instance, known=saved is not None and saved.get("generation", 0) > 0)
        state = saved or _new_state(found)
        if _store_lost(state, found):
            state = _after_loss(data, remote, writer, state, found)
            stats.republished = True
        if keep_local is not None:
            _evict(data, state, keep_local, stats)
        tables = _upload_new(data, remote, writer, state, stats)
        if tables != (state.get("last") or {}) or (state.get("last") is None and found is not None):
            state["generation"] = int(state["generation"]) + 1
            etags = _manifest_etags(state, tables)
            state["etags"] = {f"{t}/{n}": e for t, files in etags.items() for n, e in files.items()}
            _write_manifest(remote, writer, instance, state["generation"], tables, etags)
            forget_listing(remote)  # this process reads its own new generation at once
            state["last"] = tables
            stats.generation = state["generation"]
        _upload_reports(data, remote, state, stats)
        _save_state(data, state)
        _delete_expired(remote, writer, state, grace, stats)
        _save_state(data, state)
    stats.seconds = round(time.perf_counter() - t0, 3)
    return stats


def _upload_new(data: Path, remote: Remote, writer: str, state: dict[str, Any], stats: PublishStats) -> Tables:
    """Upload what is new; return the tables of the next manifest (local files, then retained ones)."""
    uploaded: dict[str, list[Any]] = state["uploaded"]
    tables: Tables = {t: dict(files) for t, files in state["retained"].items()}
    present: set[str] = set()
    for table, rel, path in _local_tables(data):
        ident = f"{table}/{rel}"
        present.add(ident)
        name = published_name(writer, rel)
        if ident not in uploaded:
            try:
                size = path.stat().st_size
                key = remote.key(f"tables/{table}/{name}")
                _put(remote, path, key)
            except FileNotFoundError:  # compacted away while we walked: it is not in this generation
                present.discard(ident)
                continue
            except OSError as e:  # the store refused or is down: the file goes with the next call
                stats.errors.append(f"{ident}: {e}")
                logger.warning("upload of %s failed (%s); it will be retried", ident, e)
                continue
            uploaded[ident] = [name, size]
            etag = _uploaded_etag(remote, key)
            known: ETags = state.setdefault("etags", {})
            if etag is not None:
                known[f"{table}/{name}"] = etag
            else:
                known.pop(f"{table}/{name}", None)
            stats.uploaded += 1
            stats.uploaded_bytes += size
        tables.setdefault(table, {})[uploaded[ident][0]] = int(uploaded[ident][1])
    now = time.time()
    for ident in [i for i in uploaded if i not in present]:
        table = ident.partition("/")[0]
        state["dropped"][remote.key(f"tables/{table}/{uploaded.pop(ident)[0]}")] = now
    return {t: files for t, files in sorted(tables.items()) if files}


@dataclass(frozen=True)
class KeepLocal:
    """Local copies of published files of ``tables`` are removed ``seconds`` after they were written."""

    seconds: float
    tables: tuple[str, ...] = ("spans", "evaluations")


def _evict(data: Path, state: dict[str, Any], keep: KeepLocal, stats: PublishStats) -> None:
    """Move uploaded files older than ``keep.seconds`` from the work directory to ``retained`` (still listed)."""
    from tracedag.pipeline.store.dedupe import SIDECAR_SUFFIX  # numpy and Arrow: not in the receivers' import

    cutoff = time.time() - keep.seconds
    uploaded: dict[str, list[Any]] = state["uploaded"]
    for ident in list(uploaded):
        table, _, rel = ident.partition("/")
        if table not in keep.tables:
            continue
        path = table_dir(data, table) / rel
        try:
            if path.stat().st_mtime > cutoff:
                continue
        except FileNotFoundError:
            continue
        name, size = uploaded.pop(ident)
        state["retained"].setdefault(table, {})[name] = int(size)
        path.unlink(missing_ok=True)
        path.with_name(path.name.removesuffix(".parquet") + SIDECAR_SUFFIX).unlink(missing_ok=True)  # dedupe keys
        stats.evicted += 1


def _upload_reports(data: Path, remote: Remote, state: dict[str, Any], stats: PublishStats) -> None:
    """Saved ``tracedag regress`` reports go to ``<store>/reports/`` under their own (unique) names."""
    done: list[str] = state.setdefault("reports", [])
    for path in sorted(reports_dir(data).glob("regress-*.json")) if reports_dir(data).is_dir() else []:
        if path.name in done:
            continue
        try:
            _put(remote, path, remote.key(f"{REPORTS}/{path.name}"))
        except OSError as e:
            stats.errors.append(f"reports/{path.name}: {e}")
            continue
        done.append(path.name)
        stats.uploaded += 1


def sync_reports(data: Path) -> None:
    """In an object store's work directory: fetch the reports other writers published (never changed once written)."""
    bound = binding(data)
    if bound is None:
        return
    remote = bound[0]
    try:
        names = [n.rpartition("/")[2] for n in remote.fs.ls(remote.key(REPORTS), detail=False)]
    except FileNotFoundError:
        return
    folder = reports_dir(data)
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        target = folder / name
        if name.startswith("regress-") and name.endswith(".json") and not target.exists():
            tmp = target.with_name(name + ".tmp")
            remote.fs.get_file(remote.key(f"{REPORTS}/{name}"), str(tmp))
            os.replace(tmp, target)


def _delete_expired(remote: Remote, writer: str, state: dict[str, Any], grace: float, stats: PublishStats) -> None:
    now = time.time()
    dropped: dict[str, float] = state["dropped"]
    for key in [k for k, t in dropped.items() if now - t >= grace]:
        try:
            remote.fs.rm_file(key)
        except FileNotFoundError:
            pass
        except OSError as e:
            stats.errors.append(f"delete {key}: {e}")
            continue
        del dropped[key]
        stats.deleted += 1
    gens = generations(remote, writer)
    for old in gens[:-2]:
        try:
            info = remote.fs.info(old)
        except FileNotFoundError:
            continue
        written = _mtime(info)
        if written is not None and now - written >= grace:
            try:
                remote.fs.rm_file(old)
            except (FileNotFoundError, OSError):
                continue


def _mtime(info: dict[str, Any]) -> float | None:
    for key in ("LastModified", "mtime", "created"):
        value = info.get(key)
        if value is None:
            continue
        if hasattr(value, "timestamp"):
            return float(value.timestamp())
        return float(value)
    return None
