"""Named queries as DuckDB table macros (issue 28, "SQL composes"), on the hand-built fixture stores.

The composition below counts the root causes of tests/queries/rca_store.py per root step, per
conversation. The rows of root_causes(per := 'conversation') are worked out by hand in
tests/queries/test_rca.py::test_one_row_per_failed_conversation:
  conv-a -> tl (lookup_order), conv-b -> m (chat), t-bad-answer -> w (get_weather),
  t-cancel -> b (fetch_b), t-other-purpose -> w and t-other-args -> w (get_weather), t-passing -> pa (search);
  t-fallback recovered (no row). So get_weather 3, chat, fetch_b, lookup_order, search 1 each.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from tracedag.pipeline.cli import cli
from tracedag.pipeline.store.procdb import VISIBLE
from tracedag.pipeline.store.query_macros import create_query_macros
from tracedag.pipeline.store.querying import run_named, run_sql, write_init_file
from tracedag.pipeline.store.views import connect
from tracedag.queries import macro_names, names
from tracedag.queries.macros import INNER_PREFIX, rename_params

COMPOSED = ("select root_step_name, count(*) as n from root_causes(per := 'conversation') "
            "group by 1 order by 1")
EXPECTED = [("chat", 1), ("fetch_b", 1), ("get_weather", 3), ("lookup_order", 1), ("search", 1)]


def pairs(rows: list[dict[str, object]]) -> list[tuple[object, ...]]:
    return [tuple(r.values()) for r in rows]


def test_root_causes_per_root_step_composes_in_sql(rca_store: Path) -> None:
    assert pairs(run_sql(rca_store, COMPOSED).to_pylist()) == EXPECTED


@pytest.mark.parametrize("command", [["query", "--sql", COMPOSED], ["sql", COMPOSED]])
def test_the_composition_from_the_cli(rca_store: Path, command: list[str]) -> None:
    result = CliRunner().invoke(cli, [*command, "--format", "csv", "--data", str(rca_store)])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ['"root_step_name","n"', '"chat",1', '"fetch_b",1', '"get_weather",3',
                                          '"lookup_order",1', '"search",1']


@pytest.mark.parametrize(("name", "params", "call"), [
    ("root_causes", {}, "root_causes()"),
    ("root_causes", {"per": "conversation"}, "root_causes(per := 'conversation')"),
    ("root_causes", {"per": "step", "strategy": "agenteval"}, "root_causes(per := 'step', strategy := 'agenteval')"),
    ("root_causes", {"trace_id": "t-cancel", "per": "step", "fail_threshold": "1.0"},
     "root_causes(trace_id := 't-cancel', per := 'step', fail_threshold := 1.0)"),
    ("propagation", {"per": "conversation"}, "propagation(per := 'conversation')"),
    ("failures", {"fail_threshold": "1.5"}, "failures(fail_threshold := 1.5)"),
    ("amplification", {"level": "3"}, "amplification(level := 3)"),
    ("trace_summary", {}, "trace_summary()"),
    ("workflow_scores", {"unscored_score": "-1"}, "workflow_scores(unscored_score := -1)"),
    ("step_stats", {"default_input_per_mtok": "2.5"}, "step_stats(default_input_per_mtok := 2.5)"),
    ("score_agreement_pairs", {}, "score_agreement_pairs()"),
    ("run_steps", {}, "run_steps()"),
    ("validations", {"failed_only": "true"}, "validations(failed_only := true)"),
])
def test_the_macro_gives_the_rows_of_the_named_query(
        rca_store: Path, name: str, params: dict[str, str], call: str) -> None:
    named = run_named(rca_store, name, params).to_pylist()
    macro = run_sql(rca_store, f"select * from {call}").to_pylist()
    assert macro == named
    if name in ("root_causes", "propagation", "failures"):
        assert named, "a comparison of two empty results proves nothing"


@pytest.mark.parametrize(("sql", "message"), [
    ("from root_causes(per := 'bogus')", "root_causes(): per must be one of trace|step|conversation, not 'bogus'"),
    ("from root_causes(per := null)", "per must be one of trace|step|conversation, not NULL (default 'trace')"),
    ("from root_causes(strategy := 'fastest')", "strategy must be one of greedy|full_path_min|weighted|agenteval"),
    ("from failures(fail_threshold := 'high')", "failures(): fail_threshold must be a double, not 'high'"),
    ("from failures(trace_id := null)", "failures(): trace_id must be a varchar, not NULL (default '')"),
    ("from propagation(max_hops := [1, 2])", "propagation(): max_hops must be an integer, not '[1, 2]'"),
    ("from propagation(per := 'step')", "propagation(): per must be one of trace|conversation, not 'step'"),
    ("from failure_steps(2.0, null)", "failure_steps(): p_trace_ids must be a list of trace ids"),
    ("from failure_steps(null, (select list(trace_id) from traces))", "p_fail_threshold must be a score, not NULL"),
    ("from trace_window(null, '')", "trace_window(): p_since_ns must be a time in ns, not NULL"),
    ("from determinism()", "determinism(): the store has no table run_paths yet"),
])
def test_arguments_that_would_give_no_rows_raise_a_clear_error(rca_store: Path, sql: str, message: str) -> None:
    with pytest.raises(Exception, match=None) as caught:
        run_sql(rca_store, sql)
    assert message in str(caught.value)


def test_a_bad_argument_raises_on_an_empty_store_too(tmp_path: Path) -> None:
    # the checks run while DuckDB binds the statement, before any row is read
    (tmp_path / "state").mkdir()
    with pytest.raises(Exception, match="per must be one of"):
        run_sql(tmp_path, "from root_causes(per := 'turn')")
    assert run_sql(tmp_path, "select count(*) as n from root_causes(per := 'conversation')").to_pylist() == [{"n": 0}]


def test_a_list_of_no_trace_is_no_trace(rca_store: Path) -> None:
    # list() over no rows is NULL typed as a list: the named queries pass it for an empty window
    sql = "select count(*) as n from failure_steps(2.0, (select list(trace_id) from traces where false))"
    assert run_sql(rca_store, sql).to_pylist() == [{"n": 0}]
    assert run_named(rca_store, "failures", {"trace_id": "no-such-trace"}).num_rows == 0


def test_the_init_file_defines_the_macros_for_a_plain_duckdb(rca_store: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["sql", "--init", str(tmp_path / "init.sql"), "--data", str(rca_store)])
    assert result.exit_code == 0, result.output
    assert f"duckdb -init {tmp_path / 'init.sql'}" in result.output
    con = duckdb.connect()
    con.execute((tmp_path / "init.sql").read_text())
    assert con.execute(COMPOSED).fetchall() == EXPECTED
    with pytest.raises(duckdb.Error, match="per must be one of"):
        con.execute("from root_causes(per := 'turn')")
    assert write_init_file(rca_store).name == "duckdb_init.sql"  # the default place


def test_connections_make_the_macros_the_sql_calls(rca_store: Path) -> None:
    con = connect(rca_store)
    made = {r[0] for r in con.execute("select function_name from duckdb_functions() "
                                      f"where function_type = 'table_macro' and {VISIBLE}").fetchall()}
    assert "failure_steps" in made and "root_causes" not in made  # shared macros always, named ones on demand
    assert create_query_macros(con, "select * from failures() join root_causes() using (trace_id)")
    made = {r[0] for r in con.execute("select function_name from duckdb_functions() "
                                      f"where function_type = 'table_macro' and {VISIBLE}").fetchall()}
    assert {"failures", "root_causes"} <= made and "propagation" not in made
    assert create_query_macros(con, "from failures()") == []  # already there


def test_ad_hoc_sql_binds_the_shared_macros_only_when_it_calls_them(rca_store: Path) -> None:
    """``tracedag sql``/``run_sql``: on a database of its own (``--read-only``), a statement that calls no named query
    and no shared macro runs without binding the shared macros (~60 ms CPU); one that calls either gets them. On the
    process's database they are bound once per process, in a catalog every connection reads (``store.procdb``).
    The answers are the named query's."""
    listed = ("select count(*) as n from duckdb_functions() where function_name = 'failure_steps' "
              "and database_name = current_database()")
    assert run_sql(rca_store, listed, read_only=True).to_pylist() == [{"n": 0}]
    calls = f"{listed} and (select count(*) from failures()) >= 0"
    assert run_sql(rca_store, calls, read_only=True).to_pylist() == [{"n": 1}]
    common = f"select count(*) as n from duckdb_functions() where function_name = 'failure_steps' and {VISIBLE}"
    assert run_sql(rca_store, common).to_pylist() == [{"n": 1}]
    direct = "select count(*) as n from failure_steps(2.0, (select list(trace_id) from traces))"
    assert run_sql(rca_store, direct).to_pylist()[0]["n"] > 0
    assert pairs(run_sql(rca_store, COMPOSED).to_pylist()) == EXPECTED


def test_macro_names_lists_what_a_statement_may_call() -> None:
    got = macro_names()
    assert set(names()) <= set(got)
    assert {"failure_steps", "trace_window", "failure_dag_roots", "span_costs", "model_prices"} <= set(got)
    assert not any(n.startswith(INNER_PREFIX) for n in got)


def test_parameters_are_renamed_outside_strings_and_comments_only() -> None:
    text = "select $a, '$a', \"$a\" -- $a\n/* $a */ from t where x = $a_b"
    assert rename_params(text, "p_") == "select p_a, '$a', \"$a\" -- $a\n/* $a */ from t where x = p_a_b"


def test_duckdb_suggestions_reach_the_user(rca_store: Path) -> None:
    result = CliRunner().invoke(cli, ["query", "--sql", "select trce_id from traces", "--data", str(rca_store)])
    assert result.exit_code == 1
    assert "Candidate bindings" in result.output and '"trace_id"' in result.output
    result = CliRunner().invoke(cli, ["sql", "select * from tracs", "--data", str(rca_store)])
    assert result.exit_code == 1
    assert 'Did you mean "traces' in result.output
    assert result.output.count("Error: query") == 1  # one error, its lines kept together
    # a misspelt named query: DuckDB's suggestion names it (its macro is made for a near name too)
    result = CliRunner().invoke(cli, ["sql", "from root_cause(per := 'step')", "--data", str(rca_store)])
    assert result.exit_code == 1 and 'Did you mean "root_causes"' in result.output


def test_the_sql_endpoint_runs_statements_that_call_the_macros(rca_store: Path) -> None:
    from starlette.testclient import TestClient

    from tracedag.pipeline.serve.app import create_app

    # serve's application in this process, its SQL worker processes as tracedag serve runs them (a served
    # process would add ~2 s of CPU: its imports and its warm pass, which the endpoint does not use)
    with TestClient(create_app(rca_store, warm=False)) as client:
        r = client.post("/api/sql", json={"sql": COMPOSED})
        assert r.status_code == 200, r.text
        assert [(row["root_step_name"], row["n"]) for row in r.json()["rows"]] == EXPECTED
        r = client.post("/api/sql", json={"sql": "select count(*) as n from root_causes(per := 'turn')"})
        assert r.status_code == 400 and "per must be one of trace|step|conversation" in r.json()["error"]


def test_declared_macros_are_listed_at_once_and_filled_on_demand(rca_store: Path) -> None:
    # the SQL endpoint's spare worker declares them (its guard lists the names), the run fills the bodies
    con = connect(rca_store, declare_macros=True)
    listed = {r[0] for r in con.execute("select function_name from duckdb_functions() "
                                        f"where function_type = 'table_macro' and {VISIBLE}").fetchall()}
    assert set(names()) <= listed
    with pytest.raises(duckdb.Error, match=r"root_causes\(\): its body is not made on this connection yet"):
        con.execute("from root_causes()").fetchall()
    made = create_query_macros(con, COMPOSED)
    assert len(made) == 1 and made[0].startswith(f"create or replace macro {INNER_PREFIX}root_causes")
    assert con.execute(COMPOSED).fetchall() == EXPECTED
