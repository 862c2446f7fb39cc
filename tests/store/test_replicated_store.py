"""``bench/gen.py --replicate K``: a store K times the spans of another without generating them again (10M spans).

Copy k has its own trace, span and conversation ids, the same shapes: every span keeps its parent in its
trace, every trace its one conversation, and ``tracedag build`` makes K times the traces of the source.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from bench import gen

ROOT = Path(__file__).resolve().parents[2]

TRACEDAG = str(Path(sys.executable).parent / "tracedag")


def _gen(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "bench" / "gen.py"), *args], capture_output=True, text=True,
                          timeout=300)


def _spans(data: Path) -> str:
    return f"read_parquet('{data}/tables/spans/**/*.parquet', hive_partitioning = false)"


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("src") / "store"
    gen.make_store(data, 1500, seed=3)
    return data


def test_three_copies_are_three_times_the_traces_with_the_same_shapes(source, tmp_path):
    dst = tmp_path / "x3"
    r = _gen("--replicate", "3", "--from", str(source), "--data", str(dst))
    assert r.returncode == 0, r.stderr
    con = duckdb.connect()
    one = con.execute(f"select count(*), count(distinct trace_id), count(distinct conversation_id) from {_spans(source)}").fetchone()
    three = con.execute(f"select count(*), count(distinct trace_id), count(distinct conversation_id), "
                        f"count(distinct (trace_id, span_id)) from {_spans(dst)}").fetchone()
    assert one is not None and three is not None and one[0] > 1000
    assert three == (3 * one[0], 3 * one[1], 3 * one[2], 3 * one[0])
    # every parent in its own trace, every trace in one conversation, as in the source
    orphans = con.execute(f"""
        with s as (select * from {_spans(dst)})
        select count(*) from s c where c.parent_span_id is not null and c.parent_span_id <> ''
          and not exists (select 1 from s p where p.trace_id = c.trace_id and p.span_id = c.parent_span_id)""").fetchone()
    assert orphans == (0,)
    mixed = con.execute(f"select count(*) from (select trace_id from {_spans(dst)} where conversation_id is not null "
                        f"group by trace_id having count(distinct conversation_id) > 1)").fetchone()
    assert mixed == (0,)
    built = subprocess.run([TRACEDAG, "build", "--idle", "0", "--data", str(dst)], capture_output=True, text=True,
                           timeout=300)
    assert built.returncode == 0, built.stderr
    traces = con.execute(f"select count(*) from read_parquet('{dst}/tables/traces/**/*.parquet')").fetchone()
    assert traces == (3 * one[1],)


def test_bad_replicate_arguments_are_refused_and_write_nothing(source, tmp_path):
    r = _gen("--replicate", "2", "--data", str(tmp_path / "a"))
    assert r.returncode == 2 and "--replicate K needs --from STORE" in r.stderr
    r = _gen("--replicate", "0", "--from", str(source), "--data", str(tmp_path / "b"))
    assert r.returncode != 0 and "give 1 to 65535 copies" in r.stderr
    assert not (tmp_path / "b").exists()
    r = _gen("--replicate", "2", "--from", str(source), "--data", str(source))
    assert r.returncode != 0 and "already holds spans" in r.stderr
