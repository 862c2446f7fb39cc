"""CLI commands: query, queries, sql."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from tracedag.pipeline.commands._options import data_option

_F = TypeVar("_F", bound=Callable[..., Any])


def _with_data(f: _F) -> _F:
    """The shared ``--data`` option, typed for mypy --strict."""
    return data_option(f)


@click.command("query")
@click.argument("name", required=False)
@click.option("--sql", "sql_text", help="Run this SQL over the views instead of a named query.")
@click.option("--param", "-p", "params", multiple=True, metavar="NAME=VALUE",
              help="Bind a query parameter (repeatable); `tracedag queries` lists them.")
@click.option("--since", help="Only traces that started in this window: 15m, 1h, 2d, 1w, or an ISO time.")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json", "parquet"]), default="table",
              show_default=True, help="Output format.")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path),
              help="Write to this file instead of stdout.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True),
              help="Seconds before the query is interrupted (default: no limit).")
@click.option("--wide", is_flag=True, help="Table format: every column (by default a named query shows its main ones).")
@click.option("--columns", "columns", metavar="A,B,C",
              help="Only these columns, in this order (every format); an unknown name lists the columns.")
@click.option("--read-only", is_flag=True,
              help="With --sql: run exactly one SELECT, with file access to the store only (no COPY, no "
                   "read_text('/etc/passwd'), no extensions).")
@_with_data
def query_command(name: str | None, sql_text: str | None, params: tuple[str, ...], since: str | None,
                  fmt: str, output: Path | None, timeout: float | None, read_only: bool, data: Path,
                  wide: bool, columns: str | None) -> None:
    """Run the named query NAME (or --sql) over the store and print or write the result."""
    from tracedag.pipeline.store import querying
    from tracedag.schemas.errors import QueryFailed

    if (name is None) == (sql_text is None):
        raise click.UsageError("give either a query NAME or --sql, not both")
    if sql_text is not None:
        if params or since:
            raise QueryFailed("--sql", "--param and --since apply to named queries only")
        table = querying.run_sql(data, sql_text, timeout=timeout, read_only=read_only)
    else:
        table = querying.run_named(data, name or "", querying.parse_param_args(params), since, timeout=timeout)
    _emit(table, fmt, output, _Shown(name or "--sql", wide, columns))
    hint = querying.empty_hint(data, name, sql_text) if table.num_rows == 0 else None
    if hint:
        click.echo(f"0 rows: {hint}", err=True)


class _Shown:
    """Which columns of a result to print: --wide, --columns, else the query's default ones (table only)."""

    def __init__(self, name: str, wide: bool, columns: str | None) -> None:
        self.name, self.wide = name, wide
        self.columns = None if columns is None else [c.strip() for c in columns.split(",") if c.strip()]

    def select(self, table: Any, fmt: str) -> tuple[Any, str]:
        from tracedag import queries
        from tracedag.pipeline.commands._table import shown_columns

        named = self.name in queries.names()
        defaults = queries.default_columns(self.name) if named and fmt == "table" else ()
        picked: tuple[Any, str] = shown_columns(table, self.name, defaults, self.wide, self.columns)
        return picked


def _emit(table: Any, fmt: str, output: Path | None, shown: _Shown | None = None) -> None:
    from tracedag.pipeline.commands._table import print_result
    from tracedag.pipeline.store import querying

    table, note = shown.select(table, fmt) if shown is not None else (table, "")
    if fmt == "table":
        print_result(table, output, note=note)
        return
    if output is None:
        querying.write_result(table, fmt, sys.stdout.buffer)
        return
    with open(output, "wb") as fh:
        querying.write_result(table, fmt, fh)
    click.echo(f"wrote {table.num_rows} rows to {output}", err=True)


@click.command("queries")
def queries_command() -> None:
    """List the named queries with their descriptions and parameters."""
    from rich.table import Table

    from tracedag import queries
    from tracedag.pipeline.commands._table import print_whole

    view = Table("query", "description", "params (default)")
    for name in queries.names():
        doc = queries.describe(name)
        params = ", ".join(f"{p.name}={p.default!r}" if p.type == "varchar" else f"{p.name}={p.default}"
                           for p in doc.params)
        view.add_row(name, doc.description, params)
    view.caption = ("each is also a table macro in any SQL (tracedag sql, query --sql, /api/sql), "
                    "e.g. select * from root_causes(per := 'conversation')")
    print_whole(view)


@click.command("sql")
@click.argument("statement", required=False)
@click.option("--init", "init_file", is_flag=False, flag_value="-", default=None, metavar="[FILE]",
              help="Write an init file (the views and query macros) for your own DuckDB, print how to use it, "
                   "and exit. FILE defaults to <data>/state/duckdb_init.sql.")
@click.option("--print-only", is_flag=True, hidden=True, help="The same as --init (kept for old scripts).")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json", "parquet"]), default="table",
              show_default=True, help="Output format of STATEMENT's result.")
@_with_data
def sql_command(statement: str | None, init_file: str | None, print_only: bool, fmt: str, data: Path) -> None:
    """Run STATEMENT over the store's views and print the result, or open a SQL shell.

    Named queries are table macros: select root_step_name, count(*) from root_causes(per := 'conversation')
    group by 1. Without STATEMENT a shell opens on one DuckDB connection (no duckdb binary needed;
    .help lists its commands); with standard input not a terminal it runs the statements read from it.

    \f
    Args:
        statement: SQL to run (one statement, or several separated by ;: the last one's result is printed).
        init_file: write the init file there ("-": the default place) and exit.
        print_only: the same as --init without FILE.
        fmt: table, csv, json or parquet.
        data: the store.
    """
    from tracedag.pipeline.store import querying

    if init_file is not None or print_only:
        _write_init(data, None if init_file in (None, "-") else Path(init_file or "-"))
        return
    if statement is not None:
        table = querying.run_sql(data, statement)
        _emit(table, fmt, None)
        hint = querying.empty_hint(data, None, statement) if table.num_rows == 0 else None
        if hint:
            click.echo(f"0 rows: {hint}", err=True)
        return
    sys.exit(_shell(data, fmt))


def _shell(data: Path, fmt: str) -> int:
    from tracedag.pipeline.commands._shell import open_shell
    from tracedag.pipeline.store.views import connect

    con = connect(data)
    try:
        banner = (f"tracedag SQL on {data} (DuckDB). Statements end with ;  .help for commands, "
                  ".queries for the named queries, .quit to leave.")
        return open_shell(con, lambda table: _emit(table, fmt, None), banner)
    finally:
        con.close()


def _write_init(data: Path, path: Path | None) -> None:
    from tracedag.pipeline.store import querying

    init = querying.write_init_file(data, path)
    example = "select root_step_name, count(*) from root_causes(per := 'conversation') group by 1"
    click.echo(f"Views and query macros of {data} written to {init}.")
    click.echo(f"DuckDB shell:  duckdb -init {init}     (or, inside duckdb: .read {init})")
    click.echo("Python:")
    click.echo("    import duckdb")
    click.echo(f"    con = duckdb.connect(); con.execute(open({str(init)!r}).read())")
    click.echo(f"    con.sql({example!r}).show()")
    click.echo("  or, where tracedag is installed (reads the files present when it connects):")
    click.echo("    from tracedag.pipeline.store.views import connect")
    click.echo(f"    con = connect({str(data)!r}, query_macros=True)")
    click.echo(f"No duckdb binary needed: tracedag sql --data {data}")
    click.echo("The file lists the files of the store now: write it again when tables appear.")


COMMANDS: list[click.Command] = [query_command, queries_command, sql_command]
