"""tracedag query --sql --read-only and --timeout: one SELECT, file access to the store only, a deadline."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from bench.gen import make_store
from tracedag.pipeline.cli import cli
from tracedag.pipeline.store.querying import run_sql
from tracedag.schemas.errors import QueryFailed


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("sandbox") / "d"
    make_store(data, 600, seed=5)
    return data


def test_a_select_over_the_views_runs(store: Path) -> None:
    assert run_sql(store, "select count(*) as n from spans", read_only=True).column("n")[0].as_py() > 0


@pytest.mark.parametrize("sql", [
    "select * from read_text('/etc/passwd')",
    "select * from read_csv('/etc/hostname')",
    "select * from glob('/*')",
    "from '/etc/passwd'",
])
def test_files_outside_the_store_are_refused(store: Path, sql: str) -> None:
    # read functions hit the file-system lock; a bare string is no table once replacement scans are off
    with pytest.raises(QueryFailed, match="Permission Error|disabled by configuration|/etc/passwd does not exist"):
        run_sql(store, sql, read_only=True)


def test_a_relative_escape_from_the_store_is_refused(store: Path, tmp_path: Path) -> None:
    secret = store.parent / "secret.csv"
    secret.write_text("k\nv\n")
    with pytest.raises(QueryFailed, match="Permission Error|disabled by configuration"):
        run_sql(store, f"select * from read_csv('{store}/../secret.csv')", read_only=True)


@pytest.mark.parametrize(("sql", "why"), [
    ("copy (select 1) to 'evil.csv'", "SELECT statements only"),
    ("select 1; copy (select 1) to 'evil.csv'", "exactly one statement"),
    ("set enable_external_access = true", "SELECT statements only"),
    ("attach 'x.db'", "SELECT statements only"),
    ("select * from read_csv('~/x')", "'~' paths"),
])
def test_anything_but_one_select_is_refused_before_it_runs(store: Path, sql: str, why: str) -> None:
    with pytest.raises(QueryFailed, match=why):
        run_sql(store, sql, read_only=True)
    assert not (Path.cwd() / "evil.csv").exists() and not (store / "evil.csv").exists()


def test_a_semicolon_inside_a_literal_is_one_statement(store: Path) -> None:
    assert run_sql(store, "select ';' as s", read_only=True).column("s")[0].as_py() == ";"


def test_a_runaway_query_is_interrupted_at_the_timeout(store: Path) -> None:
    with pytest.raises(QueryFailed, match=r"timed out after 0.5 s"):
        run_sql(store, "select count(*) from range(1000000000) a, range(1000) b", timeout=0.5)


def test_the_cli_flags(store: Path) -> None:
    refused = CliRunner().invoke(cli, ["query", "--sql", "select * from read_text('/etc/passwd')", "--read-only",
                                       "--data", str(store)])
    assert refused.exit_code == 1 and "Permission Error" in refused.output
    slow = CliRunner().invoke(cli, ["query", "--sql", "select count(*) from range(1000000000) a, range(1000) b",
                                    "--timeout", "0.5", "--data", str(store)])
    assert slow.exit_code == 1 and "timed out after 0.5 s" in slow.output
