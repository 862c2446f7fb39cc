"""What a ``tracedag serve`` start costs before any request (#33, #31).

The server imports neither the SQL guard (sqlglot: only the SQL worker parses SQL) nor the regress package
(polars, the gate: only /api/regressions reads saved reports), and its warm-up computes the whole-store
results on one connection, the same tables each request would compute."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tracedag.pipeline.serve.data import Store
from tracedag.pipeline.store.querying import run_named

_IMPORTS = """
import json, sys
from pathlib import Path
from tracedag.pipeline.cli import cli
from tracedag.pipeline.serve.app import create_app
create_app(Path(sys.argv[1]), warm=False)
print(json.dumps([m for m in ("sqlglot", "polars", "tracedag.pipeline.regress") if m in sys.modules]))
"""


def test_the_server_starts_without_the_guard_or_the_regress_package(serve_store: Path) -> None:
    out = subprocess.run([sys.executable, "-c", _IMPORTS, str(serve_store)], check=True, capture_output=True,
                         text=True, timeout=120).stdout
    assert json.loads(out.strip().splitlines()[-1]) == []


def test_the_warm_up_caches_what_each_query_gives(serve_store: Path) -> None:
    store = Store(serve_store)
    store.warm()
    state = store.state()
    for name in ("trace_summary", "propagation", "root_causes"):
        cached = store.cache.peek(state, repr((name, [], None)))
        assert cached is not None, name
        assert cached.equals(run_named(serve_store, name, {}, None)), name
    total, page = store.traces()
    assert total == page.num_rows > 0


def test_a_warm_up_after_a_request_keeps_the_cached_list(serve_store: Path) -> None:
    store = Store(serve_store)
    listed = store.named("trace_summary", {}, None)
    store.warm()
    assert store.named("trace_summary", {}, None) is listed
    assert store.cache.peek(store.state(), repr(("root_causes", [], None))) is not None


def test_the_reports_reader_is_loaded_ahead_only_for_a_store_with_reports(tmp_path: Path) -> None:
    from tracedag.pipeline.serve.app import _load_reports_reader

    assert not _load_reports_reader(tmp_path)
    (tmp_path / "reports").mkdir()
    assert not _load_reports_reader(tmp_path)
    (tmp_path / "reports" / "regress-20260101T000000Z-a.json").write_text("{}")
    assert _load_reports_reader(tmp_path)


def test_a_store_without_reports_lists_none(tmp_path: Path, serve_store: Path) -> None:
    from tracedag.pipeline.regress import saved
    from tracedag.pipeline.serve.app import _list_reports

    assert _list_reports(tmp_path) == [] == saved.list_reports(tmp_path)
    assert _list_reports(serve_store) == saved.list_reports(serve_store)
