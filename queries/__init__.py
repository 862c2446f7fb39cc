"""Named SQL queries: one ``.sql`` file per result, loaded by name.

Each file starts with a comment header. Its first line is ``-- <name>: <one-line description>``;
parameter lines read ``--   $name  type  = default  help text`` (type: double, bigint, integer,
varchar or boolean; ``''`` is the empty string; ``one of a|b|c`` in the help text restricts the
values). The body refers to parameters as ``$name`` and they are always bound, never formatted in.
Files whose name starts with ``_`` are not named queries: they define DuckDB table macros shared
by the named queries (created on every connection by ``tracedag.pipeline.store.views``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib.resources import files

PARAM_TYPES = ("double", "bigint", "integer", "varchar", "boolean")
_PARAM_LINE = re.compile(
    r"^\s*\$(?P<name>\w+)\s+(?P<type>" + "|".join(PARAM_TYPES) + r")\s*=\s*(?P<default>'[^']*'|\S+)\s*(?P<help>.*)$"
)
_CHOICES = re.compile(r"one of ([\w.-]+(?:\|[\w.-]+)+)")
_USED = re.compile(r"\$([A-Za-z_]\w*)")


@dataclass(frozen=True)
class Param:
    """A parameter declared in a query header."""

    name: str
    type: str
    default: str
    help: str
    choices: tuple[str, ...] = ()


@dataclass(frozen=True)
class QueryDoc:
    """What a query's header says: description, parameters; and the ``$names`` its body binds."""

    name: str
    description: str
    params: tuple[Param, ...]
    used: tuple[str, ...]


def load(name: str) -> str:
    """Return the text of ``queries/<name>.sql``."""
    return files(__name__).joinpath(f"{name}.sql").read_text(encoding="utf-8")


def _sql_names() -> list[str]:
    return sorted(p.name[:-4] for p in files(__name__).iterdir() if p.name.endswith(".sql"))


def names() -> list[str]:
    """Return the names of every bundled named query, sorted (``_*.sql`` files hold shared macros)."""
    return [n for n in _sql_names() if not n.startswith("_")]


def macro_files() -> list[str]:
    """Return the names of the ``_*.sql`` files: ``create macro`` statements the named queries call."""
    return [n for n in _sql_names() if n.startswith("_")]


def header_lines(text: str) -> list[str]:
    """Return the leading ``--`` comment lines of ``text`` without their ``--`` prefix."""
    out = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped.startswith("--"):
            break
        out.append(stripped[2:])
    return out


def body_params(text: str) -> tuple[str, ...]:
    """Return the distinct ``$names`` used in the SQL outside comments, in order of appearance."""
    code = re.sub(r"--[^\n]*", "", text)
    code = re.sub(r"'(?:[^']|'')*'", "''", code)
    return tuple(dict.fromkeys(_USED.findall(code)))


def _param(line: str) -> Param | None:
    m = _PARAM_LINE.match(line)
    if m is None:
        return None
    default = m["default"]
    if default.startswith("'"):
        default = default[1:-1]
    choices = _CHOICES.search(m["help"])
    return Param(m["name"], m["type"], default, m["help"].strip(),
                 tuple(choices.group(1).split("|")) if choices else ())


def describe(name: str) -> QueryDoc:
    """Parse the header of ``queries/<name>.sql``."""
    text = load(name)
    lines = header_lines(text)
    first = lines[0].strip() if lines else ""
    prefix = f"{name}:"
    description = first[len(prefix):].strip() if first.startswith(prefix) else first
    params = tuple(p for p in (_param(line) for line in lines) if p is not None)
    return QueryDoc(name, description, params, body_params(text))


_COLUMNS_LINE = re.compile(r"^\s*columns:\s*(?P<names>.+)$")


def default_columns(name: str) -> tuple[str, ...]:
    """The columns a terminal table of ``name`` shows first: its header's ``-- columns: a, b, c`` line (none: all)."""
    for line in header_lines(load(name)):
        m = _COLUMNS_LINE.match(line)
        if m is not None:
            return tuple(c.strip() for c in m["names"].split(",") if c.strip())
    return ()


def macro_names() -> list[str]:
    """Every table macro a statement may call: the named queries and the shared macros of ``_*.sql``."""
    from tracedag.queries.macros import macro_names as names_of_macros  # macros imports this module

    return names_of_macros()
