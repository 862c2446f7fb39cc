"""#31: the files a garbage collection writes stay sorted by trace id, as a build writes them, so a reader
of one trace still skips the row groups of the others after a merge or a rewrite."""

from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq

from tests.store.test_gc import N_TRACES, resend, seed, snapshot
from tracedag.pipeline.dag import build_store
from tracedag.pipeline.store.gc import GcSettings
from tracedag.schemas.layout import table_dir


def test_merged_and_rewritten_files_are_sorted_by_trace_id(tmp_path: Path) -> None:
    seed(tmp_path)
    build_store(tmp_path, idle_seconds=0)
    cfg = GcSettings(max_small_files=2, small_rows=40)
    done = {"rewritten": 0, "merged": 0}
    for step in range(2, 10):
        resend(tmp_path, range(step % 5, N_TRACES, 2 + step % 4), step)
        gc = build_store(tmp_path, idle_seconds=0, full=step % 4 == 0, compact=step % 3 == 0, gc=cfg).gc
        assert gc is not None
        for k in done:
            done[k] += sum(getattr(gc, k).values())
    assert min(done.values()) > 0, done
    written = [f for t in ("traces", "dag_nodes", "dag_edges") for f in table_dir(tmp_path, t).glob("*.parquet")
               if f.name.startswith(("gc-", "compact-"))]
    assert written
    for f in written:
        ids = pq.read_table(f, columns=["trace_id"]).column("trace_id")
        assert ids.equals(ids.take(pc.sort_indices(ids))), f.name
    assert snapshot(tmp_path)["traces"]  # the views still read


