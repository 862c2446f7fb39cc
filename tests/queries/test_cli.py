"""The query CLI: named queries, --sql, formats, parameters, --since, errors; queries; sql."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from tracedag.pipeline.cli import cli
from tracedag.pipeline.store.querying import since_to_ns
from tracedag.queries import describe, load, names

MINE = ("failures", "propagation", "root_causes", "amplification", "workflow_scores", "step_stats",
        "trace_summary")


def run(query_store: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, [*args, "--data", str(query_store)])
    return result.exit_code, result.output


def test_json_output_and_param_binding(query_store: Path) -> None:
    code, out = run(query_store, "query", "root_causes", "--param", "strategy=weighted", "-p", "trace_id=t2-converge",
                    "--format", "json")
    assert code == 0, out
    got = json.loads(out)
    assert [(r["failed_span_id"], r["root_span_id"], r["strategy"]) for r in got] == [("j", "b1", "weighted")]


def test_csv_output_flattens_lists(query_store: Path) -> None:
    code, out = run(query_store, "query", "propagation", "-p", "trace_id=t2-converge", "--format", "csv")
    assert code == 0, out
    got = {r["span_id"]: r for r in csv.DictReader(io.StringIO(out))}
    assert json.loads(got["j"]["nearest_failing_upstream"]) == ["a2", "b2"]
    assert got["j"]["kind"] == "propagated"
    assert len(got) == 5


def test_parquet_to_file(query_store: Path, tmp_path: Path) -> None:
    target = tmp_path / "fail.parquet"
    code, out = run(query_store, "query", "failures", "--format", "parquet", "--output", str(target))
    assert code == 0, out
    assert pq.read_table(target).num_rows == 17


def test_table_output(query_store: Path) -> None:
    code, out = run(query_store, "query", "workflow_scores")
    assert code == 0, out
    assert "t5-clean" in out and "4.286" in out and "6 rows" in out  # 30/7 (test_scores_stats)


def test_ad_hoc_sql(query_store: Path) -> None:
    code, out = run(query_store, "query", "--sql", "select count(*) as n from spans", "--format", "csv")
    assert code == 0, out
    assert list(csv.reader(io.StringIO(out))) == [["n"], ["25"]]


def test_since_filters_by_trace_start(query_store: Path) -> None:
    # the fixture traces start at 2023-11-14T22:13:20Z plus 0, 1, ..., 5 s
    code, out = run(query_store, "query", "trace_summary", "--since", "2023-11-14T22:13:22.500Z", "--format", "json")
    assert code == 0, out
    assert [r["trace_id"] for r in json.loads(out)] == ["t4-ties", "t5-clean", "t6-flat"]
    code, out = run(query_store, "query", "failures", "--since", "1h", "--format", "json")
    assert code == 0, out
    assert json.loads(out) == []


def test_since_parsing() -> None:
    now = 10**19
    assert since_to_ns("1h", now) == now - 3600 * 10**9
    assert since_to_ns("30m", now) == now - 1800 * 10**9
    assert since_to_ns("2d", now) == now - 2 * 86400 * 10**9
    assert since_to_ns("1970-01-01T00:00:01Z") == 10**9


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("query", "no_such_query"), "no such query"),
        (("query", "root_causes", "-p", "strategy=best"), "not one of greedy, full_path_min, weighted"),
        (("query", "failures", "-p", "fail_threshold=high"), "is not a double"),
        (("query", "failures", "-p", "colour=red"), "unknown param colour"),
        (("query", "failures", "-p", "novalue"), "name=value"),
        (("query", "--sql", "select * from no_such_table"), "no_such_table"),
        (("query", "failures", "--since", "yesterday"), "neither a duration"),
        (("query", "--sql", "select 1", "--since", "1h"), "named queries only"),
    ],
)
def test_errors_are_clean_messages(query_store: Path, args: tuple[str, ...], message: str) -> None:
    code, out = run(query_store, *args)
    assert code != 0
    assert message in out
    assert "Traceback" not in out


def test_injection_in_a_param_returns_no_extra_rows(query_store: Path) -> None:
    code, out = run(query_store, "query", "failures", "-p", "trace_id=t1-chain' or '1'='1", "--format", "json")
    assert code == 0, out
    assert json.loads(out) == []
    code, out = run(query_store, "query", "trace_summary", "-p", "trace_id=x'; drop view spans; --", "--format", "json")
    assert code == 0, out
    assert json.loads(out) == []
    code, out = run(query_store, "query", "--sql", "select count(*) as n from spans", "--format", "csv")
    assert list(csv.reader(io.StringIO(out))) == [["n"], ["25"]]


def test_queries_lists_descriptions(query_store: Path) -> None:
    result = CliRunner().invoke(cli, ["queries"])
    assert result.exit_code == 0, result.output
    for name in MINE:
        assert name in result.output
    assert "strategy='greedy'" in result.output


def test_sql_prints_how_to_attach_and_the_init_file_defines_the_views(
    query_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import duckdb

    monkeypatch.setenv("PATH", "")  # no duckdb binary: print how to attach
    code, out = run(query_store, "sql", "--init")
    assert code == 0, out
    init = query_store / "state" / "duckdb_init.sql"
    assert f"duckdb -init {init}" in out and "connect(" in out
    con = duckdb.connect()
    con.execute(init.read_text())
    assert con.execute("select count(*) from dag_nodes").fetchone() == (25,)
    # the named queries run in that shell too: their shared table macros are defined there
    params = {p.name: p.default for p in describe("root_causes").params}
    assert con.execute(load("root_causes"), {k: v for k, v in params.items() if f"${k}" in load("root_causes")}).fetchall()


def test_my_query_headers_declare_every_parameter_they_use() -> None:
    for name in MINE:
        assert name in names()
        doc = describe(name)
        declared = {p.name for p in doc.params}
        assert doc.description, name
        assert set(doc.used) == declared, name
        assert {"fail_threshold", "since_ns", "trace_id"} <= declared, name


@pytest.mark.parametrize("name", MINE)
def test_every_query_runs_on_an_empty_store(tmp_path: Path, name: str) -> None:
    (tmp_path / "state").mkdir()  # what a collector that got nothing yet leaves
    result = CliRunner().invoke(cli, ["query", name, "--format", "json", "--data", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == []
    assert "0 rows: the store has no spans yet" in result.stderr


def test_connect_takes_the_path_as_tracedag_sql_prints_it(query_store: Path) -> None:
    from tracedag.pipeline.store.views import connect

    code, out = run(query_store, "sql", "--print-only")
    assert code == 0 and "from tracedag.pipeline.store.views import connect" in out
    printed = next(line.strip() for line in out.splitlines() if line.strip().startswith("con = connect("))
    con = eval(printed.removeprefix("con = "), {"connect": connect})  # the line as a user pastes it: a str path
    assert con.execute("select count(*) from traces").fetchone()[0] == 6
