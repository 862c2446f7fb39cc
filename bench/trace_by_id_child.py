"""Child of ``bench/trace_by_id.py --before``: times one trace's reads with whichever tracedag it imports.

The parent starts one child per code version (``PYTHONPATH`` picks the checkout) and sends it one
command a line on stdin; the child answers one line of JSON with the seconds it took (wall) and the CPU
seconds of its process (every DuckDB thread: on a loaded machine the wall time is mostly waiting):

- ``show ID``: ``tracedag show``'s reads (``dag.show.load_shown``: a connection of its own, the store's
  freshness checked as a new process does);
- ``view ID``: the web UI's first request for a trace, ``GET /api/traces/{id}/view``
  (``traces_api.trace_view``), on the warm Store (its whole-store results computed, as the server's
  warm-up and the trace list page leave them; nothing of this trace cached);
- ``cold ID``: ``GET /api/traces/{id}`` (``Store.trace_json``) on a Store just opened (only its id set read;
  freshness not remembered), in this process, which read other traces before: what it keeps across Stores
  (``serve.tracefiles``' row group filters of the files it read, since #31) is kept, as by a server whose
  build state changed (a new connection);
- ``fresh ID``: the same in a server just started: those filters forgotten too (read from the store's
  ``state/trace_files``, which an earlier server or this one's warm-up kept);
- ``first ID``: the same with none kept on disk either (the first start on a store, before its warm-up read them);
- ``unknown``: an unknown id on the warm Store (404);
- ``metrics``: ``/metrics`` on a Store just opened (nothing cached; ``materialized``'s per-process
  freshness answers forgotten too; the text a previous server kept on disk removed: a new build state);
- ``metrics_kept``: the same on the build state a previous server computed (after ``metrics``: its text
  is kept on disk since #31);
- ``poll``: a live poll, ``root_causes`` (defaults) on a connection of its own (``querying.run_named``, as
  ``tracedag query`` and a dashboard's poll run it; the freshness check paid as a new process does);
- ``poll_first``: the same as the first poll after a round or a build: the freshness answer kept on disk for
  the store's listing removed first (the table of each trace's newest round, which a round keeps, stays).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

Timed = tuple[float, float]


def _seconds(fn: Callable[[], object]) -> Timed:
    """Wall seconds and CPU seconds of this process (every DuckDB thread) ``fn()`` took."""
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def _forget_freshness() -> None:
    """Forget what this process remembers of the store's stored rows (a new process knows only what is on disk)."""
    from tracedag.pipeline.store import materialized

    getattr(materialized, "_FRESH", {}).clear()
    try:
        from tracedag.pipeline.store import current_rounds
    except ImportError:  # a tracedag before #31's current rounds
        return
    current_rounds._LAST.clear()


def _forget_files(data: Path, on_disk: bool = False) -> None:
    """Forget the row group filters this process read (``serve.tracefiles``; a tracedag before it has none), and
    with ``on_disk`` those kept in the store."""
    try:
        from tracedag.pipeline.serve import tracefiles
    except ImportError:
        return
    tracefiles.KEPT.clear()
    if on_disk:
        shutil.rmtree(data / "state" / tracefiles.KEPT_DIR, ignore_errors=True)


def main() -> int:
    """Answer the parent's commands until stdin closes."""
    from tracedag.pipeline.dag.show import load_shown
    from tracedag.pipeline.serve import tracelist, traces_api
    from tracedag.pipeline.serve.data import NotFound, Store
    from tracedag.pipeline.serve.metrics import Metrics
    from tracedag.pipeline.store.querying import run_named

    data = Path(sys.argv[1])
    warm = Store(data)
    warm.warm()
    tracelist.page(warm, tracelist.query_from({}))
    traces_api.cross_turn_causes(warm)
    warm.trace_ids()

    def unknown() -> None:
        try:
            warm.trace_json(uuid.uuid4().hex)
        except NotFound:
            return
        raise AssertionError("a random id was found")

    def show(tid: str) -> Timed:
        _forget_freshness()  # as a `tracedag show` process: the freshness check is paid (the metrics reads
        return _seconds(lambda: load_shown(data, tid))  # before it left it remembered or not)

    def cold(tid: str, fresh: bool = False, first: bool = False) -> Timed:
        _forget_freshness()  # a server just started
        if fresh or first:
            _forget_files(data, on_disk=first)
        store = Store(data)
        store.trace_ids()
        return _seconds(lambda: store.trace_json(tid))

    def metrics(kept: bool) -> Timed:
        """``/metrics`` on a Store just opened: a new build state (nothing kept), or the state of the previous
        server (the text it kept on disk, since #31; a tracedag before it computes again)."""
        _forget_freshness()
        if not kept:
            shutil.rmtree(data / "state" / "metrics", ignore_errors=True)
        return _seconds(lambda: Metrics(Store(data)).text())

    def poll(first: bool = False) -> Timed:
        """A new process's poll; ``first``: the first after a round or a build: no freshness answer is kept for
        the store's listing (a round keeps the table of each trace's newest round itself, since #31's current
        rounds: that one stays)."""
        _forget_freshness()
        if first:
            for kept in (data / "state" / "materialized").glob("fresh-*.json"):
                kept.unlink()
        return _seconds(lambda: run_named(data, "root_causes"))

    commands: dict[str, Callable[[str], Timed]] = {
        "show": show,
        "view": lambda tid: _seconds(lambda: traces_api.trace_view(warm, tid)),
        "cold": cold,
        "fresh": lambda tid: cold(tid, fresh=True),
        "first": lambda tid: cold(tid, first=True),
        "unknown": lambda _: _seconds(unknown),
        "metrics": lambda _: metrics(False),
        "metrics_kept": lambda _: metrics(True),
        "poll": lambda _: poll(),
        "poll_first": lambda _: poll(True),
    }
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        what, _, arg = line.strip().partition(" ")
        wall, cpu = commands[what](arg)
        print(json.dumps({"seconds": wall, "cpu": cpu}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
