"""A store's *build state*: ``state_key(data)``, the digest the server's caches and the SQL worker's views are
kept per (see ``data``).

Its own small module: the SQL worker (``sqlworker``) needs it before it is ready, and importing ``data`` there
(the trace reads, the named-query runner) cost each spare worker ~30 ms CPU more at its start.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from tracedag.pipeline.store.listing import cached_listing
from tracedag.pipeline.store.remote import remote_of
from tracedag.schemas.layout import tables_dir


def state_key(data: Path) -> str:
    """A digest of the store's Parquet files (path, size, mtime): changes with every write."""
    h = hashlib.blake2b(digest_size=12)
    root = tables_dir(data)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith(".parquet"):
                try:
                    st = os.stat(os.path.join(dirpath, name))
                except FileNotFoundError:  # removed by a GC or compaction swap since the listing
                    continue
                h.update(f"{dirpath}/{name}:{st.st_size}:{st.st_mtime_ns};".encode())
    remote = remote_of(data)
    if remote is not None:  # an object store: what every writer's newest manifest lists
        h.update(json.dumps(cached_listing(remote, fresh=True), sort_keys=True).encode())
    return h.hexdigest()
