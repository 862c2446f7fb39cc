"""The SQL worker's second layer: the connection it runs on is locked (RELIABILITY.md section 4, test 62)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import duckdb
import pytest

from tracedag.pipeline.serve.sqlworker import _limits
from tracedag.pipeline.store.sandbox import lock_down
from tracedag.pipeline.store.views import connect


@pytest.fixture
def locked(serve_store: Path):
    with tempfile.TemporaryDirectory() as temp:
        con = connect(serve_store, private=True)  # lock_down locks the whole database
        _limits(con, {"threads": 1, "memory_mb": 256, "temp_mb": 64}, temp)
        lock_down(con, serve_store)
        yield con
        con.close()


@pytest.mark.parametrize("sql", [
    "set enable_external_access = true",
    "set allowed_directories = ['/']",
    "set memory_limit = '100GB'",
    "set lock_configuration = false",
    "set home_directory = '/'",
])
def test_the_settings_cannot_be_reopened(locked: duckdb.DuckDBPyConnection, sql: str) -> None:
    with pytest.raises(duckdb.Error, match="locked|Cannot change"):
        locked.execute(sql)


def test_the_settings_are_the_locked_ones(locked: duckdb.DuckDBPyConnection) -> None:
    got = dict(locked.sql("select name, value from duckdb_settings() where name in ('enable_external_access', "
                          "'lock_configuration', 'autoinstall_known_extensions', 'autoload_known_extensions', "
                          "'allow_community_extensions', 'threads')").fetchall())
    assert got == {"enable_external_access": "false", "lock_configuration": "true", "threads": "1",
                   "autoinstall_known_extensions": "false", "autoload_known_extensions": "false",
                   "allow_community_extensions": "false"}
    with pytest.raises(duckdb.Error, match="Permission"):  # not even the persistent secrets directory opens
        locked.sql("select count(*) from duckdb_secrets()").fetchall()


def test_files_outside_the_store_stay_closed_even_past_the_parser(locked: duckdb.DuckDBPyConnection) -> None:
    with pytest.raises(duckdb.Error, match="Permission|disabled"):
        locked.sql("select * from read_text('/etc/passwd')").fetchall()
