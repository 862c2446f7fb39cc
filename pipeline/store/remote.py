"""Stores on object storage: ``--data s3://bucket/prefix`` (or any fsspec URL).

A process that works on an object store does its work in a **work directory**, an ordinary local data
directory (spool, locks, staging, the files it writes) that is bound to the store by ``state/remote.json``.
Every work directory is one **writer**: it publishes the Parquet files it holds to the store under
``tables/<table>/.../<writer>--<name>.parquet`` and lists them in its own manifest
(``manifests/<writer>/<generation>.json``, see ``tracedag.pipeline.store.manifests``). Readers union the
newest manifest of every writer; a work directory reads its own files locally. Object PUTs are atomic and a
manifest names only files already uploaded, so a reader never sees a partial file; a writer deletes a file
it dropped from its manifest only after a grace period.

Credentials and endpoint come from the usual AWS variables (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_REGION``, ``AWS_ENDPOINT_URL`` for a server that is not AWS), read by s3fs/botocore.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import threading
import uuid
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from tracedag.schemas.errors import TracedagError
from tracedag.schemas.layout import state_file

REMOTE_FILE = "remote.json"
"""``state/remote.json`` of a work directory: the store's URL and the writer id."""

ATOMIC_PUT = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "memory"})
"""Protocols whose single-object writes are atomic (elsewhere an upload goes to ``.tmp`` and is moved)."""

_URL = re.compile(r"^[a-z][a-z0-9+.-]*://", re.IGNORECASE)
_WRITER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


class RemoteUnavailable(TracedagError):  # type: ignore[misc,unused-ignore]
    """The object store cannot be used: a missing driver (s3fs), a bad URL or a refused connection."""


def is_url(value: str | Path) -> bool:
    """Whether ``--data`` names an object store (``scheme://…``) rather than a local directory."""
    return bool(_URL.match(str(value))) and not str(value).lower().startswith("file://")


def check_writer(writer: str) -> str:
    """A writer id goes into file names: letters, digits, ``_ . -``, at most 63 characters."""
    if not _WRITER.match(writer) or "--" in writer:
        raise TracedagError(f"writer id {writer!r}: use letters, digits, '_', '.', '-' (no '--'), at most 63")
    return writer


def default_writer(work: Path) -> str:
    """The host name and a hash of the work directory's path: stable, and unique per work directory."""
    host = re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname() or "host").replace("--", "-")[:48].strip("-.") or "host"
    return f"{host}-{hashlib.sha256(str(work.resolve()).encode()).hexdigest()[:6]}"


@dataclass(frozen=True)
class Remote:
    """An object store: its URL, the root path in it (``bucket/prefix``) and its fsspec filesystem, made on
    first use: a process that only reads an S3 store (listings, manifests, ranged GETs) with keys in the
    environment does it with ``s3lite`` and never imports s3fs (about 1.5 s of a fresh process)."""

    url: str
    protocol: str
    root: str
    lite: Any = field(default=None, compare=False)  # an s3lite.S3Lite, or None: s3fs does every read too

    @cached_property
    def fs(self) -> Any:
        """The fsspec filesystem (s3fs for S3): every write, and the reads ``lite`` does not make."""
        return new_filesystem(self.protocol)

    @property
    def reads(self) -> Any:
        """What lists and reads the store: the light client when there is one, else ``fs``."""
        return self.fs if self.lite is None else self.lite

    def key(self, rel: str) -> str:
        """The filesystem path of ``rel`` (``tables/...``, ``manifests/...``) under the root."""
        return f"{self.root}/{rel}" if self.root else rel

    def uri(self, rel: str) -> str:
        """The full URL of ``rel``, as DuckDB reads it through the registered filesystem."""
        return f"{self.protocol}://{self.key(rel)}"

    def reading_fs(self) -> Any:
        """The filesystem DuckDB reads the store through: the local object cache's, unless it is off (fsspec: made
        only when DuckDB reads a URL, ``cachereads.defer_reads``)."""
        from tracedag.pipeline.store.cachedfsspec import reading_filesystem

        return reading_filesystem(lambda: self.fs, lite=self.lite, protocol=self.protocol, key=self)

    def cached_reads(self) -> Any:
        """The store's listings and local object cache (a ``cachedfs.StoreReads``, the one ``reading_fs`` reads
        through; no fsspec), or None when the cache is off."""
        from tracedag.pipeline.store.cachedfs import store_reads

        return store_reads(lambda: self.fs, lite=self.lite, protocol=self.protocol, key=self)


def split_url(url: str) -> tuple[str, str]:
    """``s3://bucket/prefix/`` → ``("s3", "bucket/prefix")``."""
    protocol, _, rest = url.partition("://")
    root = rest.strip("/")
    if not root and protocol.lower() not in ("memory",):
        raise RemoteUnavailable(f"{url}: name a bucket (and optionally a prefix), e.g. s3://my-bucket/tracedag")
    return protocol.lower(), root


def new_filesystem(protocol: str) -> Any:
    """An fsspec filesystem for ``protocol`` that never serves a stale listing."""
    try:
        import fsspec
    except ImportError as e:  # pragma: no cover - fsspec comes with the s3 extra
        raise RemoteUnavailable("object stores need fsspec: pip install 'tracedag[s3]'") from e
    options: dict[str, Any] = {"skip_instance_cache": True}
    if protocol in ("s3", "s3a"):
        options.update(_s3_options())
    try:
        return fsspec.filesystem(protocol, **options)
    except (ImportError, ValueError) as e:
        raise RemoteUnavailable(f"no driver for {protocol}:// ({e}); for S3: pip install 'tracedag[s3]'") from e


def _s3_options() -> dict[str, Any]:
    """s3fs settings: listings never cached, bounded timeouts and retries (a dead server fails fast), TLS contexts
    shared (``shared_tls_session``)."""
    config: dict[str, Any] = {"connect_timeout": 5, "read_timeout": 60, "retries": {"max_attempts": 3, "mode": "standard"}}
    session = shared_tls_session()
    if session is not None:
        config["http_session_cls"] = session
    options: dict[str, Any] = {"use_listings_cache": False, "config_kwargs": config}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        options["endpoint_url"] = endpoint
    return options


_TLS: dict[str, Any] = {}
"""The TLS context of each verify setting (``repr`` of True, or of a CA bundle's path), made once per process."""
_TLS_CLASS: list[Any] = []


def shared_tls_session() -> Any:
    """aiobotocore's HTTP session class with one TLS context per process for the same verify setting (None: not
    this aiobotocore). Each s3fs filesystem makes a session, and each session read the CA bundle into a new
    context (``load_verify_locations``: ~25-40 ms CPU, 159 times in a run of the test suite). A session with a
    client certificate or a proxy makes its own, as before."""
    if _TLS_CLASS:
        return _TLS_CLASS[0]
    try:
        from aiobotocore.httpsession import AIOHTTPSession
    except ImportError:  # pragma: no cover - s3fs brings aiobotocore
        return None
    if not hasattr(AIOHTTPSession, "_build_ssl_contexts"):  # another aiobotocore: its own contexts
        return None

    class SharedTLSSession(AIOHTTPSession):  # type: ignore[misc,unused-ignore]
        def _build_ssl_contexts(self, proxy_url: Any) -> Any:
            if self._cert_file or proxy_url:
                return super()._build_ssl_contexts(proxy_url)
            ident = repr(self._verify)
            with _TLS_LOCK:  # a context is read-only once made: every connection of the process may use it
                if ident not in _TLS:
                    _TLS[ident] = super()._build_ssl_contexts(proxy_url)[0]
                return _TLS[ident], None

    _TLS_CLASS.append(SharedTLSSession)
    return SharedTLSSession


_TLS_LOCK = threading.Lock()

_OPEN: dict[str, Remote] = {}


def open_remote(url: str) -> Remote:
    """The ``Remote`` of ``url`` (one filesystem per URL and process)."""
    ident = f"{url} {os.environ.get('AWS_ENDPOINT_URL_S3') or os.environ.get('AWS_ENDPOINT_URL') or ''}"
    found = _OPEN.get(ident)
    if found is not None:
        return found
    from tracedag.pipeline.store.s3lite import S3Lite  # here: a local store's commands do without http/ssl

    protocol, root = split_url(url)
    remote = Remote(url=url, protocol=protocol, root=root, lite=S3Lite.from_env(protocol))
    _OPEN[ident] = remote
    return remote


def work_dir_for(url: str) -> Path:
    """The default work directory of ``url``: ``$TRACEDAG_WORK_DIR`` or ``~/.cache/tracedag/stores/<name>``."""
    explicit = os.environ.get("TRACEDAG_WORK_DIR")
    if explicit:
        return Path(explicit)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tracedag" / "stores"
    protocol, root = split_url(url)
    slug = re.sub(r"[^A-Za-z0-9_.-]", "-", f"{protocol}-{root}")[:60]
    return base / f"{slug}-{hashlib.sha256(url.encode()).hexdigest()[:8]}"


def attach(work: Path, url: str, writer: str | None = None) -> Path:
    """Bind the work directory ``work`` to the store ``url`` (created when missing); return ``work``.

    A work directory belongs to one store: binding it to another is refused. The writer id is kept
    from the first binding unless ``writer`` names one.
    """
    path = state_file(work, REMOTE_FILE)
    current = _read_binding(path)
    if current is not None and current["url"] != url:
        raise TracedagError(f"{work} is the work directory of {current['url']}, not of {url}: give another one")
    chosen = check_writer(writer or (current or {}).get("writer") or default_writer(work))
    if current is None or current.get("writer") != chosen:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(REMOTE_FILE + ".tmp")
        instance = (current or {}).get("instance") or uuid.uuid4().hex
        tmp.write_text(json.dumps({"url": url, "writer": chosen, "instance": instance}), encoding="utf-8")
        os.replace(tmp, path)
    for name in ("tables", "state"):
        (work / name).mkdir(parents=True, exist_ok=True)
    return work


_BOUND: dict[str, tuple[tuple[int, int, int], dict[str, str]]] = {}
"""``_read_binding``'s answers by path, with the file's (inode, mtime, size) they were read at: a named query asks
~40 times (~1 ms of reading and parsing); a file written again (``attach``: a new inode) is read again."""


def _read_binding(path: Path) -> dict[str, str] | None:
    try:
        st = os.stat(path)
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        hit = _BOUND.get(str(path))
        if hit is not None and hit[0] == stamp:
            return dict(hit[1])
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise TracedagError(f"{path} is not readable ({e}); remove it to bind the directory again") from e
    found = {"url": str(raw["url"]), "writer": str(raw["writer"]), "instance": str(raw.get("instance", ""))}
    _BOUND[str(path)] = (stamp, found)
    return dict(found)


def binding(data: Path) -> tuple[Remote, str] | None:
    """The store and writer id ``data`` is bound to, or None for a plain local data directory."""
    found = _read_binding(state_file(data, REMOTE_FILE))
    if found is None:
        return None
    return open_remote(found["url"]), found["writer"]


def instance_of(data: Path) -> str:
    """The random id of a work directory (told apart from another one that uses the same writer id)."""
    found = _read_binding(state_file(data, REMOTE_FILE))
    return "" if found is None else found["instance"]


def remote_of(data: Path) -> Remote | None:
    """The store ``data`` works on, or None."""
    found = binding(data)
    return None if found is None else found[0]


class StorePath(type(Path())):  # type: ignore[misc]  # PosixPath or WindowsPath
    """The work directory of an object store, shown as the store's URL in messages (``f"{data}"``).

    Every file operation uses the local path; only formatting (what a command prints as "try: tracedag …
    --data {data}") gives the URL, so the commands a user is told to run name the store, not the cache.
    """

    store_url: str = ""

    def __format__(self, spec: str) -> str:
        return format(self.store_url or str(self), spec)


def bind_store(url: str, work: Path | None, writer: str | None, create: bool) -> Path:
    """``--data URL``: check the store answers (and, unless ``create``, holds a store); return the work directory."""
    remote = open_remote(url)
    probe(remote, create)
    path = StorePath(attach(work or work_dir_for(url), url, writer))
    path.store_url = url
    return path


def probe(remote: Remote, create: bool) -> None:
    """Raise ``RemoteUnavailable`` with the reason when the store cannot be used as asked."""
    bucket = remote.root.partition("/")[0]
    try:
        if bucket:
            try:
                remote.reads.ls(bucket, detail=False)  # exists() would read a refused connection as "no bucket"
            except FileNotFoundError:
                raise RemoteUnavailable(f"{remote.url}: bucket {bucket!r} does not exist (create it first)") from None
        if not create and not remote.reads.exists(remote.key("manifests")):
            raise RemoteUnavailable(
                f"{remote.url} holds no tracedag store (no manifests/): collect into it first "
                f"(tracedag collect --data {remote.url} --spool DIR)")
    except RemoteUnavailable:
        raise
    except Exception as e:  # botocore/aiohttp errors are not all OSError: any failure here means unusable
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "the default endpoint"
        raise RemoteUnavailable(f"{remote.url}: the store did not answer ({type(e).__name__}: {e}); "
                                f"endpoint {endpoint}, credentials from AWS_* variables") from e
