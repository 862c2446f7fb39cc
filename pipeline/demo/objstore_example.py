"""The demo's object-store stage: the demo's spans through an object store, as two collectors would write them.

The store is fsspec's in-memory filesystem (``memory://``), so the demo needs no server: the same code
publishes to S3. Two writers (work directories standing for two collectors) each publish half of the spans
files, a third builds and scores what both published and publishes its derived tables, and a fourth, fresh,
reads everything back through DuckDB; its root causes must equal the local store's.
"""

from __future__ import annotations

import shlex
import shutil
import tempfile
import uuid
from collections.abc import Mapping
from pathlib import Path

from tracedag.pipeline.dag import build_store
from tracedag.pipeline.score import score_store
from tracedag.pipeline.store.files import parquet_files
from tracedag.pipeline.store.listing import read_listing
from tracedag.pipeline.store.manifests import publish
from tracedag.pipeline.store.querying import run_named
from tracedag.pipeline.store.remote import attach, open_remote
from tracedag.pipeline.store.views import connect
from tracedag.schemas.layout import table_dir


def _count(data: Path, view: str) -> int:
    con = connect(data, shared_macros=False)  # a count over a view: no shared query macro
    try:
        row = con.execute(f"select count(*) from {view}").fetchone()
        return int(row[0]) if row else 0
    finally:
        con.close()


def _split_spans(data: Path, writers: list[Path]) -> None:
    """Give each writer every other spans file of the demo store, in its own tables/spans/."""
    for k, path in enumerate(parquet_files(data, "spans")):
        target = table_dir(writers[k % len(writers)], "spans") / path.relative_to(table_dir(data, "spans"))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)


def demo_objstore(data: Path) -> dict[str, int]:
    """Publish the demo's spans from two writers, build on a third, read on a fourth; return the counts."""
    url = f"memory://tracedag-demo-{uuid.uuid4().hex[:8]}/store"
    with tempfile.TemporaryDirectory(prefix="tracedag-demo-objstore-") as tmp:
        root = Path(tmp)
        writers = [attach(root / name, url, name) for name in ("collector-a", "collector-b")]
        _split_spans(data, writers)
        for w in writers:
            publish(w)
        builder = attach(root / "builder", url, "builder")
        build_store(builder, idle_seconds=0.0)
        score_store(builder)
        publish(builder)
        reader = attach(root / "reader", url, "reader")
        remote_causes, local_causes = run_named(reader, "root_causes"), run_named(data, "root_causes")
        same = sorted(map(str, remote_causes.to_pylist())) == sorted(map(str, local_causes.to_pylist()))
        counts = {"objstore_writers": len(read_listing(open_remote(url))), "objstore_traces": _count(reader, "traces"),
                  "objstore_root_causes": remote_causes.num_rows, "objstore_same": int(same)}
        open_remote(url).fs.rm(url.partition("://")[2].partition("/")[0], recursive=True)
    return counts


def objstore_line(data: Path, counts: Mapping[str, int]) -> str:
    """One line: what the object-store round trip read back, and the commands to try next."""
    same = "the same as" if counts["objstore_same"] else "NOT the same as"
    where = shlex.quote(str(data))
    return (f"object storage: {counts['objstore_writers']} writers published to one store (in memory here, S3 the same "
            f"way); a fresh reader got {counts['objstore_traces']} traces and {counts['objstore_root_causes']} root "
            f"causes, {same} the local store ({where}); on S3 every command takes --data s3://BUCKET/PREFIX "
            f"(AWS_ENDPOINT_URL for SeaweedFS or MinIO), e.g. tracedag collect --data s3://BUCKET/PREFIX "
            f"--collector-id c1")
