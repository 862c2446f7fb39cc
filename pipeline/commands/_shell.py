"""``tracedag sql`` without a statement: a SQL shell on one DuckDB connection with the tracedag views.

No ``duckdb`` binary is needed. On a terminal it reads lines with readline (history in
``~/.tracedag_history``, or ``$TRACEDAG_HISTORY``); a statement may span lines and ends with ``;``.
Dot commands (``.tables``, ``.schema NAME``, ``.queries``, ``.help``, ``.quit``) stand on a line of
their own. An error is printed and the shell goes on. With standard input not a terminal the same
statements are read from it (``echo "select 1;" | tracedag sql``), and the exit status is 1 when
one of them failed.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TextIO

import click
import duckdb
import pyarrow as pa

from tracedag import queries
from tracedag.pipeline.store import procdb
from tracedag.pipeline.store.query_macros import create_query_macros
from tracedag.pipeline.store.querying import duckdb_message, to_arrow
from tracedag.queries.macros import code_only

HISTORY_ENV = "TRACEDAG_HISTORY"
SHELL_ROWS = 10_000  # rows a statement's result is read up to
PROMPT, MORE = "tracedag> ", "     ...> "
HELP = """\
SQL over the store's views; end a statement with ;  (it may span lines)
  .tables          the views and the named-query macros
  .schema NAME     the columns of a view, or the parameters and columns of a named query
  .queries         the named queries, callable as table macros: from root_causes(per := 'conversation')
  .help            this text
  .quit, .exit     leave (or Ctrl-D)"""

Show = Callable[[Any], None]


def history_path() -> Path:
    """Where the shell keeps its readline history."""
    return Path(os.environ.get(HISTORY_ENV) or Path.home() / ".tracedag_history")


def complete(buffer: str) -> bool:
    """True when ``buffer`` ends with ``;`` outside strings, quoted names and comments."""
    code = code_only(buffer, keep_strings=False)
    if "'" in code or '"' in code or "/*" in code:  # an unterminated string, name or comment
        return False
    return code.rstrip().endswith(";")


def statements(lines: Iterable[str]) -> Iterator[str]:
    """Group input lines into statements (ending with ``;``) and dot commands (one line each)."""
    buffer = ""
    for line in lines:
        if not buffer.strip() and line.strip().startswith("."):
            yield line.strip()
            continue
        buffer += line if line.endswith("\n") else line + "\n"
        if complete(buffer):
            yield buffer.strip()
            buffer = ""
    if buffer.strip():
        yield buffer.strip()  # the last statement may omit its ;


class Shell:
    """Runs statements and dot commands on ``con``; results go to ``show``, errors to stderr."""

    def __init__(self, con: duckdb.DuckDBPyConnection, show: Show) -> None:
        self.con, self.show = con, show
        self.failed = 0

    def run(self, text: str) -> bool:
        """Run one statement or dot command; False when the shell should stop."""
        try:
            if text.startswith("."):
                return self.dot(text)
            self.execute(text)
        except duckdb.Error as e:
            self.error(duckdb_message(e))
        except pa.ArrowException as e:
            self.error(f"the result cannot be shown: {e}")
        except KeyboardInterrupt:
            self.con.interrupt()
            self.error("interrupted")
        return True

    def error(self, message: str) -> None:
        self.failed += 1
        click.echo(f"Error: {message}", err=True)

    def execute(self, sql: str) -> None:
        create_query_macros(self.con, sql)
        relation = self.con.sql(sql)
        if relation is None:
            return
        reader = (getattr(relation, "to_arrow_reader", None) or relation.fetch_arrow_reader)(1024)
        batches: list[pa.RecordBatch] = []
        rows = 0
        for batch in reader:  # a shell shows a screenful: never read a whole big table into memory
            batches.append(batch)
            rows += batch.num_rows
            if rows > SHELL_ROWS:
                click.echo(f"(stopped reading after {rows} rows: add a LIMIT, or write them all with "
                           "tracedag query --sql \"...\" --format csv -o FILE)", err=True)
                break
        self.show(pa.Table.from_batches(batches, schema=reader.schema))

    def dot(self, line: str) -> bool:
        command, _, arg = line.partition(" ")
        command, arg = command.lower(), arg.strip()
        if command in (".quit", ".exit", ".q"):
            return False
        actions: dict[str, Callable[[str], None]] = {
            ".help": lambda _: click.echo(HELP), ".tables": self.tables, ".schema": self.schema,
            ".queries": lambda _: click.echo(queries_text()),
        }
        action = actions.get(command)
        if action is None:
            self.error(f"unknown command {command} (.help lists them)")
        else:
            action(arg)
        return True

    def tables(self, _: str) -> None:
        views = [r[0] for r in self.con.execute(
            "select distinct view_name from duckdb_views() where not internal and schema_name = 'main' "
            f"and {procdb.SEEN} order by 1").fetchall()]
        click.echo("views:  " + "  ".join(views))
        click.echo("named queries (table macros, .queries):  " + "  ".join(f"{n}()" for n in queries.names()))

    def schema(self, name: str) -> None:
        if not name:
            self.error(".schema needs a NAME (.tables lists them)")
            return
        if name in queries.names():
            click.echo(signature(name))
            create_query_macros(self.con, name)
            self.show(to_arrow(self.con.sql(f"describe select * from {name}()")))
            return
        known = {r[0] for r in self.con.execute(
            "select view_name from duckdb_views() where not internal and schema_name = 'main' "
            f"and {procdb.SEEN}").fetchall()}
        if name not in known:
            self.error(f"no view or named query {name} (.tables lists them)")
            return
        self.show(to_arrow(self.con.sql(f'describe "{name}"')))


def signature(name: str) -> str:
    """``name(param := default, ...)`` of a named query, as its table macro takes it."""
    doc = queries.describe(name)
    params = [f"{p.name} := {p.default!r}" if p.type == "varchar" else f"{p.name} := {p.default}" for p in doc.params]
    declared = {p.name for p in doc.params}
    params += [f"{u} := NULL" for u in doc.used if u not in declared]
    return f"{name}({', '.join(params)})"


def queries_text() -> str:
    """The named queries, one per line with their parameters, then their descriptions."""
    lines = []
    for name in queries.names():
        lines.append(signature(name))
        lines.append(f"    {queries.describe(name).description}")
    return "\n".join(lines)


def run_stream(shell: Shell, stream: TextIO) -> int:
    """Run every statement of ``stream`` (not a terminal); 1 when one failed, else 0."""
    for text in statements(stream):
        if not shell.run(text):
            break
    return 1 if shell.failed else 0


def _load_history(history: Path) -> None:
    import readline

    with contextlib.suppress(OSError):  # no history yet
        readline.read_history_file(history)
    readline.set_history_length(2000)


def _save_history(history: Path) -> None:
    import readline

    try:
        history.parent.mkdir(parents=True, exist_ok=True)
        readline.write_history_file(history)
    except OSError as e:
        click.echo(f"(history not saved: {e})", err=True)


def interactive(shell: Shell, banner: str) -> int:
    """Read statements at a prompt until ``.quit`` or Ctrl-D (Ctrl-C drops the statement being typed)."""
    history = history_path()
    _load_history(history)
    click.echo(banner)
    buffer = ""
    try:
        while True:
            try:
                line = input(MORE if buffer else PROMPT)
            except KeyboardInterrupt:
                click.echo("")
                buffer = ""
                continue
            except EOFError:
                click.echo("")
                break
            if not buffer and line.strip().startswith("."):
                if not shell.run(line.strip()):
                    break
                continue
            buffer += line + "\n"
            if complete(buffer):
                shell.run(buffer.strip())
                buffer = ""
    finally:
        _save_history(history)
    return 0


def open_shell(con: duckdb.DuckDBPyConnection, show: Show, banner: str, stdin: TextIO | None = None) -> int:
    """Run the shell on ``con``: interactive on a terminal, else statements read from standard input."""
    stream = stdin or sys.stdin
    shell = Shell(con, show)
    if stream.isatty():
        return interactive(shell, banner)
    return run_stream(shell, stream)
