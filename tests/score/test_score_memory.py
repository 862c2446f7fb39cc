"""Scoring a store larger than memory (issue #31): ``tracedag score`` stores the named queries' results of every
trace in parts of ``--materialize-part`` traces, DuckDB gets a memory limit from ``--memory-limit`` /
``TRACEDAG_SCORE_MEMORY`` (default: a quarter of the available memory) and spills to the store's disk; a bad value is
refused before anything is written. On a 10M-span store the one round of every trace was killed by the kernel
at 19.7 GB resident (DuckDB's default limit is 80 % of the machine's RAM)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.queries.test_materialized import assert_materialized_equal
from tests.score.score_support import StoreBuilder, agent_turn
from tracedag.pipeline.cli import cli
from tracedag.pipeline.dag.build import build_store
from tracedag.pipeline.score.memory import (
    DEFAULT_SHARE,
    FLOOR,
    MEMORY_ENV,
    bounded_connection,
    mem_available,
    memory_limit,
    parse_memory,
)
from tracedag.pipeline.store.querying import run_sql


def _store(data: Path) -> None:
    b = StoreBuilder(data)
    b.spans(agent_turn("a1", "conv-a", 1_000_000, "search") + agent_turn("a2", "conv-a", 2_000_000, "lookup")
            + agent_turn("b1", "conv-b", 3_000_000, "plan") + agent_turn("c1", "conv-c", 4_000_000, "pay")
            + agent_turn("d1", "conv-d", 5_000_000, "fetch"))
    build_store(data, idle_seconds=0)


def test_tracedag_score_stores_a_store_larger_than_a_part_in_parts(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _store(data)
    out = CliRunner(env={"COLUMNS": "200"}).invoke(
        cli, ["score", "--data", str(data), "--no-progress", "--materialize-part", "2", "--memory-limit", "300MB"])
    assert out.exit_code == 0, out.output
    parts = run_sql(data, "select mat_round, list(distinct conversation_key order by conversation_key) as convs "
                          "from materialized_traces group by mat_round").to_pylist()
    assert sorted(p["convs"] for p in parts) == [["conv-a"], ["conv-b", "conv-c"], ["conv-d"]]
    assert_materialized_equal(data)
    assert not list((data / "state").glob("duckdb-spill-*"))  # the spill directory is gone


@pytest.mark.parametrize("value", ["lots", "0", "-1GB", "150%", "8 parsecs"])
def test_a_bad_memory_limit_is_refused_before_anything_is_scored(tmp_path: Path, value: str) -> None:
    data = tmp_path / "data"
    _store(data)
    out = CliRunner(env={"COLUMNS": "200", MEMORY_ENV: value}).invoke(cli, ["score", "--data", str(data),
                                                                          "--no-progress"])
    assert out.exit_code == 2, out.output
    assert "--memory-limit" in out.output and repr(value) in out.output
    assert not (data / "tables" / "step_scores").exists()  # nothing written, nothing lost


def test_memory_sizes_and_shares() -> None:
    assert parse_memory("8GB", None) == 8 * 10**9
    assert parse_memory("512 MiB", None) == 512 * 2**20
    assert parse_memory("1.5gb", None) == 1_500_000_000
    assert parse_memory("30%", 10 * 2**30) == 3 * 2**30
    assert parse_memory("30%", None) is None  # no MemAvailable: DuckDB's default
    assert parse_memory("1MB", None) == FLOOR  # too little to plan the queries in
    with pytest.raises(ValueError, match="not a memory size"):
        parse_memory("8 GBs", None)
    with pytest.raises(ValueError, match=MEMORY_ENV):
        memory_limit(env={MEMORY_ENV: "plenty"})
    assert memory_limit(env={MEMORY_ENV: "2GB"}) == 2 * 10**9


def test_the_default_limit_is_a_quarter_of_the_available_memory() -> None:
    available = mem_available()
    if available is None:
        pytest.skip("no /proc/meminfo here")
    assert DEFAULT_SHARE == 0.25
    limit = memory_limit(env={})
    assert limit is not None and abs(limit - available * DEFAULT_SHARE) < 0.1 * available  # it moves meanwhile


def test_the_limit_and_a_spill_directory_on_the_stores_disk_reach_the_connection(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _store(data)
    with bounded_connection(data, 300 * 2**20) as con:
        limit, temp = con.sql("select current_setting('memory_limit'), current_setting('temp_directory')").fetchall()[0]
        assert limit in ("300.0 MiB", "300 MiB", "314.5 MB"), limit
        assert Path(temp).parent == data / "state" and Path(temp).is_dir()
        assert con.execute("select count(*) from traces").fetchall() == [(5,)]  # every view
    assert not Path(temp).exists()
