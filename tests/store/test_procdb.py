"""The connections of ``views.connect`` share one DuckDB database per process, each in a catalog of its own
(``store.procdb``): what one makes is its own, and what the product sets on a database never reaches the shared one."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.shared_dirs import copy_of
from tracedag.pipeline.dag.build import build_store
from tracedag.pipeline.dag.show import load_shown
from tracedag.pipeline.score.runner import score_store
from tracedag.pipeline.store import procdb
from tracedag.pipeline.store.querying import run_named, run_sql
from tracedag.pipeline.store.sandbox import lock_down
from tracedag.pipeline.store.views import connect, forget_views, own_view, refresh_views, restrict_to_trace

GLOBAL = ("threads", "memory_limit", "temp_directory", "parquet_metadata_cache", "lock_configuration",
          "enable_external_access", "allowed_directories", "max_temp_directory_size")


def _settings(con: duckdb.DuckDBPyConnection) -> dict[str, object]:
    names = ", ".join(f"'{n}'" for n in GLOBAL)
    return dict(con.execute(f"select name, value from duckdb_settings() where name in ({names})").fetchall())


def test_two_connections_over_two_stores_see_their_own_views_macros_and_variables(query_store: Path,
                                                                                  tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    a, b = connect(query_store), connect(empty)
    assert procdb.shared(a) and procdb.shared(b)
    assert a.execute("select count(*) from spans").fetchone()[0] > 0
    assert b.execute("select count(*) from spans").fetchone()[0] == 0
    a.execute("create macro mine() as table select 1 as x; set variable v = 'a'")
    with pytest.raises(duckdb.CatalogException):
        b.execute("from mine()")
    assert b.execute("select getvariable('v')").fetchone()[0] is None
    a.close()
    b.close()


def test_a_gone_connection_leaves_no_catalog_behind(query_store: Path) -> None:
    con = connect(query_store)
    before = procdb.catalogs()
    del con
    gc.collect()
    connect(query_store).close()  # the next connection detaches the gone ones' catalogs
    assert procdb.catalogs() <= before


def test_lock_down_refuses_a_shared_connection_and_locks_a_private_one(query_store: Path) -> None:
    shared = connect(query_store)
    with pytest.raises(ValueError, match="private=True"):
        lock_down(shared, query_store)
    own = connect(query_store, private=True)
    assert not procdb.shared(own)
    lock_down(own, query_store)
    assert _settings(shared)["lock_configuration"] == "false"  # the shared database stays open
    assert connect(query_store, threads=1).execute("select current_setting('threads')").fetchone()[0] == 1


def test_building_scoring_querying_showing_and_collecting_leave_the_shared_settings_alone(
        query_store: Path, tmp_path: Path) -> None:
    """Every path that sets a global setting (a collection's one thread in the build, score's memory limit and spill directory,
    show's footer cache, the read-only sandbox) does it on a database of its own."""
    data = copy_of(query_store, tmp_path / "store")
    before = _settings(connect(data))
    build_store(data, idle_seconds=0.0, full=True)  # a full build collects the builds it replaced
    score_store(data)
    for name in ("failures", "root_causes", "trace_summary"):
        run_named(data, name)
    run_sql(data, "select count(*) from traces", read_only=True)
    trace_id = run_sql(data, "select trace_id from traces limit 1").to_pylist()[0]["trace_id"]
    load_shown(data, trace_id)
    assert _settings(connect(data)) == before


def test_a_fresh_process_answers_from_its_shared_database(query_store: Path) -> None:
    code = ("import sys; from tracedag.pipeline.store.views import connect; from tracedag.pipeline.store import procdb;"
            "c = connect(sys.argv[1]); print(procdb.shared(c), c.execute('select count(*) > 0 from spans').fetchone()[0])")
    done = subprocess.run([sys.executable, "-c", code, str(query_store)], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["True", "True"], done.stderr


def test_the_shared_macros_are_made_once_and_read_each_connections_own_views(rca_store: Path, tmp_path: Path) -> None:
    """The macros of ``queries/_*.sql`` live in one catalog of the process; called on a connection, their bodies bind
    over that connection's views, and a macro the connection makes itself comes first."""
    steps = "select count(*) from failure_steps(2.0, (select list(trace_id) from traces))"
    empty = tmp_path / "empty"
    empty.mkdir()
    expected = []
    for data in (rca_store, empty):
        own = connect(data, private=True)  # the macros made on its own database, as before
        expected.append(own.execute(steps).fetchone()[0])
    assert expected[0] > 0 and expected[1] == 0
    a, b = connect(rca_store), connect(empty)
    assert [a.execute(steps).fetchone()[0], b.execute(steps).fetchone()[0]] == expected
    a.execute("create or replace macro failure_steps(p_fail_threshold, p_trace_ids) as table select 1 as x")
    assert a.execute(steps).fetchone()[0] == 1 and b.execute(steps).fetchone()[0] == expected[1]


def _view_set(con: duckdb.DuckDBPyConnection) -> str:
    """The view set ``con`` reads (the second entry of its search path)."""
    path = con.execute("select current_setting('search_path')").fetchone()[0].split(",")
    return str(path[1]).removesuffix(".main")


def _attached(con: duckdb.DuckDBPyConnection) -> set[str]:
    return {r[0] for r in con.execute("select database_name from duckdb_databases()").fetchall()}


def test_connections_over_one_store_read_one_view_set_and_a_view_replaced_makes_them_its_own(
        query_store: Path) -> None:
    """Views are bound once per store and process (``procdb.view_set``). A view binds in its own catalog first, so a
    connection that replaces a refined view must hold the other refined views itself: its ``dag_nodes`` then follow
    its ``traces``, and the other connections' views are untouched; a refresh reads the set again."""
    a, b, c = connect(query_store), connect(query_store), connect(query_store)
    assert _view_set(a) == _view_set(b) == _view_set(c) and _view_set(a).startswith("tracedag_views_")
    nodes = "select count(distinct trace_id) from dag_nodes"
    whole = b.execute(nodes).fetchone()[0]
    assert whole > 1
    trace_id, build_id = b.execute("select trace_id, build_id from traces order by trace_id limit 1").fetchone()
    restrict_to_trace(a, trace_id, build_id)
    assert a.execute(nodes).fetchone()[0] == 1 and b.execute(nodes).fetchone()[0] == whole
    forget_views(c, replacing=["traces"])  # as a stored round's copy does before it replaces some refined views
    own_view(c, "traces", f"select * from traces_all where trace_id = '{trace_id}' and build_id = '{build_id}'")
    assert c.execute(nodes).fetchone()[0] == 1 and b.execute(nodes).fetchone()[0] == whole
    assert refresh_views(c, query_store) and c.execute(nodes).fetchone()[0] == whole  # its own views dropped
    assert c.execute("select count(*) from traces").fetchone()[0] == whole
    for con in (a, b, c):
        con.close()


def test_the_view_sets_no_connection_reads_go_once_newer_ones_push_them_out(tmp_path: Path) -> None:
    stores = []
    for i in range(procdb.KEPT_SETS + 3):  # a derived table in each: statements of its own (its path)
        table = tmp_path / f"s{i}" / "tables" / f"extra_{i}"
        table.mkdir(parents=True)
        pq.write_table(pa.table({"x": [i]}), table / "part.parquet")
        stores.append(tmp_path / f"s{i}")
    kept = connect(stores[0])  # its set is the oldest, and still read
    made = [_view_set(kept)]
    for store in stores[1:]:
        con = connect(store)
        made.append(_view_set(con))
        con.close()
        del con
    gc.collect()
    connect(stores[-1]).close()  # the next connection detaches what no connection reads any more
    attached = _attached(kept)
    assert len(set(made)) == len(stores)
    assert made[0] in attached and not set(made[1:3]) & attached  # the three oldest were pushed out; one is read
    assert set(made[3:]) <= attached
    assert kept.execute("select x from extra_0").fetchall() == [(0,)]


def test_a_forked_child_makes_its_own_view_set_and_macros(query_store: Path) -> None:
    """A child forked after its parent made a view set and the shared macros opens a database of its own: the
    parent's catalog names mean nothing there (serve's fork-server forks its SQL workers)."""
    parent = connect(query_store)
    want = parent.execute("select count(*) from failure_steps(2.0, (select list(trace_id) from traces))").fetchall()
    parents = _view_set(parent)  # asked here: the child must not touch its parent's database (its threads are gone)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        try:
            child = connect(query_store)
            got = child.execute("select count(*) from failure_steps(2.0, (select list(trace_id) from traces))")
            os._exit(0 if got.fetchall() == want and _view_set(child) != parents else 1)
        except BaseException:
            os._exit(2)
    assert _exit_code(pid, within=60) == 0
    parent.close()


_AT_EXIT_CHILD = r"""
import atexit, gc, sys
from pathlib import Path
import duckdb

def _check():  # registered before tracedag's own handler, so it runs after it (atexit runs the last first)
    cons = [o for o in gc.get_objects() if isinstance(o, duckdb.DuckDBPyConnection)]
    still = 0
    for con in cons:
        try:
            con.execute("select 1")
            still += 1
        except duckdb.ConnectionException:
            pass
    print(f"connections {len(cons)} open {still}", flush=True)

atexit.register(_check)
from tracedag.pipeline.store import procdb
from tracedag.pipeline.store.querying import run_named
from tracedag.pipeline.store.views import connect
KEPT = [connect(sys.argv[1]), connect(sys.argv[1], private=True), procdb.cursor()]  # kept for the process's life
KEPT[0].execute("select count(*) from dag_nodes").fetchall()
KEPT[1].register("held", KEPT[0].execute("select trace_id from traces").to_arrow_table())
KEPT[1].execute("select count(*) from held").fetchall()
run_named(Path(sys.argv[1]), "root_causes")
"""


def test_the_process_database_and_kept_connections_are_closed_before_the_interpreter_finalizes(
        query_store: Path) -> None:
    """A DuckDB connection still open when the interpreter finalizes may abort the process after its work is done
    (exit status 134, DuckDB issue #13904): a ``tracedag build`` once ended so. Every connection a process keeps
    (shared, private, a bare cursor, one holding a registered Arrow table) is closed at exit, before finalization."""
    done = subprocess.run([sys.executable, "-c", _AT_EXIT_CHILD, str(query_store)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    counts = done.stdout.strip().splitlines()[-1].split()
    assert counts[0] == "connections" and int(counts[1]) >= 3 and counts[2:] == ["open", "0"], done.stdout


def test_a_forked_child_exiting_normally_closes_only_its_own_connections(query_store: Path) -> None:
    """A forked child inherits the exit handler: when it runs at the child's exit it closes what the child opened,
    never its parent's database (whose threads it does not have), and the parent's connections still answer."""
    parent = connect(query_store)
    kept = procdb.close_at_exit(duckdb.connect(":memory:"))
    want = parent.execute("select count(*) from traces").fetchone()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        code = 2
        try:
            child = connect(query_store)
            code = 0 if child.execute("select count(*) from traces").fetchone() == want else 1
        finally:
            # the handler a normal exit runs (inherited; not every handler: the runner's would act for its parent)
            procdb._close_all()
            os._exit(code)
    assert _exit_code(pid, within=60) == 0  # closing the parent's database there would hang the child
    assert parent.execute("select count(*) from traces").fetchone() == want
    assert kept.execute("select 1").fetchone() == (1,)
    parent.close()
    kept.close()


def _exit_code(pid: int, within: float) -> int | None:
    """The exit code of the child ``pid``, or None (it is killed) when it has not ended ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None
