"""Issue #31: a connection over an object store registers the store's fsspec filesystem only when a statement names
one of its objects by URL (a real SeaweedFS, real DuckDB, real Parquet).

A connection's views name the local object cache's complete copies; a cold connection fetches its views' files
whole first (as DuckDB's first read would), so no view names a URL and the process never imports fsspec
(~0.05 s of CPU, half of a local named query's). A URL named later, by a caller that does not say on which
connection (a build's plan), by SQL of any kind (``tracedag sql``) or by a view over an object too big for a copy,
gets the filesystem registered first.
"""

from __future__ import annotations

import os
import subprocess
import sys

from tests.store.objfixtures import quick_module_server as s3_module_server  # noqa: F401  (the module's SeaweedFS)
from tests.store.objfixtures import remote_store
from tracedag.pipeline.store.files import parquet_files
from tracedag.pipeline.store.query_macros import create_query_macros
from tracedag.pipeline.store.remote import bind_store
from tracedag.pipeline.store.views import connect, read_list_sql

COUNT = "select count(*) from spans"


def _views(con) -> str:
    return "".join(sql for (sql,) in con.execute("select sql from duckdb_views() where not internal and database_name = current_database()").fetchall())


def test_views_over_copies_register_no_filesystem_and_a_url_named_later_gets_it_first(s3, tmp_path):
    url = f"s3://{s3.bucket}/store"
    remote_store(url, tmp_path, 6, "w")
    work = bind_store(url, tmp_path / "r", None, False)
    con = connect(work)  # cold: every file fetched whole, then named by its copy
    assert "s3://" not in _views(con) and con.list_filesystems() == []
    assert con.execute(COUNT).fetchall() == [(18,)]
    cursor = con.cursor()  # made before the filesystem: DuckDB registers it for the whole database
    spans = read_list_sql(work, parquet_files(work, "spans"))  # outside the views' making: the store's URLs
    assert "s3://" in spans
    assert con.list_filesystems() != []  # registered on the connections over the store that had none
    assert cursor.execute(f"select count(*) from {spans}").fetchall() == [(18,)]
    con.close()
    other = connect(work)
    assert other.list_filesystems() == []
    named = spans.removeprefix("read_parquet(").partition("]")[0] + "]"
    sql = f"select count(*) from read_parquet({named})"
    create_query_macros(other, sql)  # SQL of any kind (tracedag sql): a URL gets the filesystem first
    assert other.list_filesystems() != [] and other.execute(sql).fetchall() == [(18,)]
    other.close()


def test_a_view_over_an_object_with_no_copy_registers_the_filesystem(s3, tmp_path, monkeypatch):
    url = f"s3://{s3.bucket}/store"
    remote_store(url, tmp_path, 6, "w")
    monkeypatch.setenv("TRACEDAG_CACHE_WHOLE", "0")  # block copies only: the views name URLs
    con = connect(bind_store(url, tmp_path / "r", None, False))
    assert "s3://" in _views(con) and con.list_filesystems() != []
    assert con.execute(COUNT).fetchall() == [(18,)]
    con.close()


WARM = """
import sys
from pathlib import Path
from tracedag.pipeline.store.querying import run_named
from tracedag.pipeline.store.remote import bind_store
table = run_named(bind_store(sys.argv[1], Path(sys.argv[2]), None, False), "failures")
print(table.num_rows, "fsspec" in sys.modules)
"""


def test_a_named_query_in_a_fresh_process_imports_no_fsspec_cold_or_warm(s3, tmp_path):
    url = f"s3://{s3.bucket}/store"
    remote_store(url, tmp_path, 6, "w", score=True)

    def fresh(work: str, **env: str) -> list[str]:
        done = subprocess.run([sys.executable, "-c", WARM, url, str(tmp_path / work)], capture_output=True, text=True,
                              env={**os.environ, **env}, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    off = fresh("r0", TRACEDAG_CACHE_SIZE="0")  # every read through s3fs
    assert off[0] != "0" and off[1] == "True"
    assert fresh("r1") == [off[0], "False"]  # cold: fetched whole, read as local files
    assert fresh("r2") == [off[0], "False"]  # warm
