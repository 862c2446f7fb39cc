"""Every named query as a DuckDB table macro, generated from its ``.sql`` file.

``select root_step_name, count(*) from root_causes(per := 'conversation') group by 1`` runs the
body of ``queries/root_causes.sql`` with ``$per`` bound to ``'conversation'`` and every other
parameter at its header default. Each header parameter becomes a macro parameter with that default
(``name := default``); a ``$name`` the body uses without declaring it defaults to NULL.

Two macros per query, because a DuckDB table macro's parameter shadows every column of that name in
its body (``trace_id``, ``metric``, ``agent`` are parameters and columns):

- ``__tracedag_q_<name>(__tracedag_p_<param>, ...)``: the body, ``$param`` renamed to a parameter no
  column is called; positional, unchecked.
- ``<name>(param := default, ...)``: checks its arguments, then calls the first with each value cast
  to the declared type. The checks sit in the arguments of ``range()``, which DuckDB evaluates while
  binding, so a NULL, a value of the wrong type or a value outside ``one of a|b|c`` raises before
  anything runs, whatever the store holds (a filter would raise only when a row reaches it).

DuckDB also binds a macro's body when it is created, and while doing so it refuses a column of a
nested macro's body named like one of the outer macro's parameters ("Conflicting column names").
The wrapper is therefore created while ``__tracedag_q_<name>`` is a placeholder, and the body
replaces the placeholder afterwards (``statements``); at call time the names never meet.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from tracedag import queries

INNER_PREFIX = "__tracedag_q_"
PLACEHOLDER = "__tracedag_placeholder"  # the column of a body macro not filled in yet
PARAM_PREFIX = "__tracedag_p_"
_CREATE = re.compile(r"create\s+(?:or\s+replace\s+)?(?:temp\s+|temporary\s+)?macro\s+([A-Za-z_]\w*)\s*\(", re.I)
# the pieces of SQL text a $name is never replaced in: strings, quoted names, comments
_SKIP = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|--[^\n]*|/\*.*?\*/", re.S)
_DOLLAR = re.compile(r"\$([A-Za-z_]\w*)")


@dataclass(frozen=True)
class Macro:
    """The SQL that makes one named query a table macro.

    ``placeholder``, ``wrapper`` and ``body`` run in that order; ``stub`` replaces ``body`` when
    the body does not bind on a store (a table it reads is missing), see ``stub_sql``.
    """

    name: str
    placeholder: str
    wrapper: str
    body: str
    params: tuple[str, ...]


def shared_macro_names() -> list[str]:
    """The table macros the ``queries/_*.sql`` files create (``failure_steps``, ``span_costs``, ...)."""
    found: list[str] = []
    for name in queries.macro_files():
        found += [m.group(1).lower() for m in _CREATE.finditer(code_only(queries.load(name)))]
    return sorted(dict.fromkeys(found))


def macro_names() -> list[str]:
    """Every table macro a statement may call: the named queries and the shared macros, sorted."""
    return sorted(set(queries.names()) | set(shared_macro_names()))


def inner_name(name: str) -> str:
    """The name of the macro that holds the body of the named query ``name``."""
    return f"{INNER_PREFIX}{name}"


def code_only(text: str, keep_strings: bool = True) -> str:
    """``text`` with comments (and, unless ``keep_strings``, strings and quoted names) blanked."""
    return _SKIP.sub(lambda m: m.group(0) if keep_strings and m.group(0)[0] in "'\"" else " ", text)


def statements(text: str) -> list[str]:
    """``text`` cut at each ``;`` outside strings, quoted names and comments; the parts that hold code, without
    their ``;`` (DuckDB's parser does the same but costs ~50 ms CPU the first time: a database of its own)."""
    cuts: list[int] = []
    pos = 0
    for m in [*_SKIP.finditer(text), None]:
        end = len(text) if m is None else m.start()
        cuts += [i for i in range(pos, end) if text[i] == ";"]
        pos = len(text) if m is None else m.end()
    parts = [text[a:b] for a, b in zip([0, *(c + 1 for c in cuts)], [*cuts, len(text)], strict=True)]
    return [part for part in parts if code_only(part).strip()]


def rename_params(text: str, prefix: str = PARAM_PREFIX) -> str:
    """Replace every ``$name`` outside strings, quoted names and comments by ``<prefix>name``."""
    out: list[str] = []
    pos = 0
    for m in _SKIP.finditer(text):
        out.append(_DOLLAR.sub(lambda d: prefix + d.group(1), text[pos:m.start()]))
        out.append(m.group(0))
        pos = m.end()
    out.append(_DOLLAR.sub(lambda d: prefix + d.group(1), text[pos:]))
    return "".join(out)


def _body(text: str) -> str:
    """The query without its header comment and trailing semicolon."""
    lines = text.splitlines()
    start = len(queries.header_lines(text))
    return "\n".join(lines[start:]).strip().rstrip(";").rstrip()


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _default_sql(param: queries.Param) -> str:
    if param.type == "varchar":
        return _quote(param.default)
    if param.type == "boolean":
        return "true" if param.default.lower() in ("1", "true", "yes", "on") else "false"
    return f"cast({param.default} as {param.type})"


def _expects(param: queries.Param) -> str:
    if param.choices:
        return f"one of {'|'.join(param.choices)}"
    article = "an" if param.type[0] in "aeiou" else "a"
    return f"{article} {param.type}"


def _shown_default(param: queries.Param) -> str:
    return _quote(param.default) if param.type == "varchar" else param.default


def _checks(name: str, param: queries.Param) -> list[str]:
    """CASE branches that raise for a NULL, a value of the wrong type, a value not among the choices."""
    p = param.name
    what = f"{name}(): {p} must be {_expects(param)}"
    shown = f"{_quote(what + ', not ')} || {_quote(chr(39))} || cast({p} as varchar) || {_quote(chr(39))}"
    branches = [f"when {p} is null then error({_quote(f'{what}, not NULL (default {_shown_default(param)})')})",
                f"when try_cast({p} as {param.type}) is null then error({shown})"]
    if param.choices:
        listed = ", ".join(_quote(c) for c in param.choices)
        branches.append(f"when cast({p} as varchar) not in ({listed}) then error({shown})")
    return branches


@functools.cache
def build(name: str) -> Macro:
    """The macro SQL of the named query ``name`` (``queries/<name>.sql``; read once per process)."""
    doc = queries.describe(name)
    declared = {p.name: p for p in doc.params}
    order = [p.name for p in doc.params] + [u for u in doc.used if u not in declared]
    signature = ", ".join(f"{n} := {_default_sql(declared[n]) if n in declared else 'null'}" for n in order)
    inner_params = ", ".join(PARAM_PREFIX + u for u in doc.used)
    args = ", ".join(f"cast({u} as {declared[u].type})" if u in declared else u for u in doc.used)
    branches = [b for n in order if n in declared for b in _checks(name, declared[n])]
    inner = inner_name(name)
    select = f"select * from {inner}({args})"
    if branches:  # range() evaluates its argument while binding: a bad argument raises at once
        guard = "case " + " ".join(branches) + " else 1 end"
        select = f"select __tracedag_rows.* from range({guard}) __tracedag_checked, {inner}({args}) __tracedag_rows"
    return Macro(
        name=name,
        placeholder=f"create or replace macro {inner}({inner_params}) as table "
                    f"select error({_quote(f'{name}(): its body is not made on this connection yet')}) as {PLACEHOLDER}",
        wrapper=f"create or replace macro {name}({signature}) as table\n{select}",
        body=f"create or replace macro {inner}({inner_params}) as table\n{rename_params(_body(queries.load(name)))}",
        params=tuple(order),
    )


def stub_sql(name: str, reason: str) -> str:
    """A body for ``name`` that raises ``reason`` when called (its input table is missing)."""
    doc = queries.describe(name)
    inner_params = ", ".join(PARAM_PREFIX + u for u in doc.used)
    return (f"create or replace macro {inner_name(name)}({inner_params}) as table "
            f"select error({_quote(f'{name}(): {reason}')}) as unavailable")
