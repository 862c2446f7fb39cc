"""Formats a tool's schema states in words, and string arguments that break them.

A tool whose parameter is a plain ``{"type": "string"}`` may still say what the string must look
like: in the parameter's own ``description`` ("pickup time, HH:MM") or in the tool's description
(its docstring: "Book a taxi in a city at a time, HH:MM.", Google ``time: pickup time, HH:MM``,
NumPy ``time : str`` and the next lines, Sphinx ``:param time: HH:MM``). When a tool step failed
and its error says nothing (the OpenAI Agents SDK's "Tool execution failed. Error details are
redacted."), a value that breaks such a format is taken as the arguments the tool rejected.

A hint counts for a parameter only when it is clearly about it (``hints_for``):

* anywhere in the parameter's own ``description``;
* in the tool's description (the schema's top-level ``description``; ``toolschema`` puts the tool's
  description there), in the clause after ``<param>:`` or ``<param> (`` (up to the next other
  parameter named so, a blank line or 200 characters), or right after ``<param>,`` / ``<param> -``
  ("at a time, HH:MM").

A value that fits any recognised hint of its parameter, a parameter without a recognised hint and a
value that is not a string change nothing. ``HINTS`` is the whole table.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Hint:
    """A recognised format: its name, the words that state it, and the test a value must pass."""

    name: str
    stated: re.Pattern[str]
    fits: Callable[[re.Match[str], str], bool]


def _full(pattern: str) -> Callable[[re.Match[str], str], bool]:
    rx = re.compile(pattern, re.I)
    return lambda _m, value: rx.fullmatch(value.strip()) is not None


def _one_of(m: re.Match[str], value: str) -> bool:
    return value.strip().strip("'\"`").casefold() in _choices(m[1])


def _choices(listed: str) -> set[str]:
    items = re.split(r",|\bor\b|\|", listed)
    return {x.strip().strip("'\"`").casefold() for x in items if x.strip().strip("'\"`")}


def _n_digits(m: re.Match[str], value: str) -> bool:
    return re.fullmatch(rf"\d{{{int(m[1])}}}", value.strip()) is not None


_ISO = (r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}(?::?\d{2})?)?)?")
_ONE_OF_ITEM = r"['\"`]?[\w.+-]+(?: [\w.+-]+){0,2}['\"`]?"

HINTS: tuple[Hint, ...] = (
    #    name          the words that state it                                                 a value that fits
    Hint("HH:MM:SS",   re.compile(r"\bHH:MM:SS\b"),                                            _full(r"(?:[01]?\d|2[0-3]):[0-5]\d:[0-5]\d")),
    Hint("HH:MM",      re.compile(r"\bHH:MM\b(?!:SS)"),                                        _full(r"(?:[01]?\d|2[0-3]):[0-5]\d")),
    Hint("YYYY-MM-DD", re.compile(r"\bYYYY-MM-DD\b"),                                          _full(r"\d{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])")),
    Hint("ISO 8601",   re.compile(r"\bISO[ -]?8601\b", re.I),                                  _full(_ISO)),
    Hint("e-mail",     re.compile(r"\be-?mail address\b", re.I),                               _full(r"[^@\s]+@[^@\s]+\.[^@\s.]+")),
    Hint("URL",        re.compile(r"\b(?:URL|URI)\b"),                                         _full(r"[a-z][a-z0-9+.-]*://\S+")),
    Hint("one of",     re.compile(rf"\bone of:?\s+({_ONE_OF_ITEM}(?:\s*(?:,|\bor\b|\|)\s*(?:or\s+)?{_ONE_OF_ITEM})+)", re.I), _one_of),
    Hint("N digits",   re.compile(r"\b(\d{1,2})[- ]digits?\b", re.I),                          _n_digits),
    Hint("digits",     re.compile(r"\b(?:digits only|only digits)\b", re.I),                   _full(r"\d+")),
)  # fmt: skip


@dataclass(frozen=True)
class Broken:
    """A string argument that breaks the format its parameter's hint states."""

    param: str
    value: str
    hint: str


def hints_for(param: str, schema: dict[str, Any]) -> list[tuple[Hint, re.Match[str]]]:
    """The recognised hints clearly about ``param`` in ``schema`` (see the module docstring)."""
    texts = [_own_description(param, schema)]
    tool = schema.get("description")
    if isinstance(tool, str):
        texts += _clauses(param, tool, _others(param, schema))
    found: list[tuple[Hint, re.Match[str]]] = []
    for text in texts:
        for hint in HINTS:
            m = hint.stated.search(text)
            if m is not None:
                found.append((hint, m))
    return found


def _own_description(param: str, schema: dict[str, Any]) -> str:
    props = schema.get("properties")
    prop = props.get(param) if isinstance(props, dict) else None
    text = prop.get("description") if isinstance(prop, dict) else None
    return text if isinstance(text, str) else ""


def _others(param: str, schema: dict[str, Any]) -> list[str]:
    props = schema.get("properties")
    return [p for p in props if p != param] if isinstance(props, dict) else []


def _clauses(param: str, tool: str, others: list[str]) -> list[str]:
    """The parts of the tool's description about ``param``: after ``param:``/``param (``, up to the
    next other parameter named so, a blank line or 200 characters; right after ``param,``/``param -``."""
    name = re.escape(param)
    out: list[str] = []
    for m in re.finditer(rf"(?<![\w.-]){name}\s*(?::|\()", tool):
        out.append(_cut(tool[m.end():m.end() + 200], others))
    for m in re.finditer(rf"(?<![\w.-]){name}\s*(?:,|-{{1,2}}|—)[ \t]*", tool):
        out.append(_first_words(tool[m.end():m.end() + 200]))
    return out


def _cut(clause: str, others: list[str]) -> str:
    ends = [clause.find("\n\n")] + [m.start() for o in others
                                     for m in re.finditer(rf"(?<![\w.-]){re.escape(o)}\s*(?::|\()", clause)]
    ends = [e for e in ends if e >= 0]
    return clause[:min(ends)] if ends else clause


def _first_words(rest: str) -> str:
    """A format named right after ``param,``: its first words ("in HH:MM", "one of a, b")."""
    m = re.match(r"(?:(?:in|as|format(?:ted as)?)\s+)?(\S+(?:\s+\S+){0,1})", rest)
    return m[0] if m else ""


def broken_arguments(args: Any, schema: dict[str, Any]) -> Broken | None:
    """The first string argument of ``args`` that fits none of its parameter's recognised hints."""
    if not isinstance(args, dict):
        return None
    for param, value in args.items():
        if not isinstance(value, str):
            continue
        hints = hints_for(param, schema)
        if hints and not any(h.fits(m, value) for h, m in hints):
            return Broken(param, value, hints[0][0].name)
    return None


# Words of an error that says nothing about the cause: what every failed tool call's error says,
# the OpenAI Agents SDK's redaction ("Error running tool (non-fatal): {'tool_name': ..., 'error':
# 'Tool execution failed. Error details are redacted.'}") and its apology to the model.
_SAYS_NOTHING = frozenset(re.findall(r"\S+", (
    "a an the is are was were error errors exception running run tool tool_name function call calling execution "
    "executing failed failure fail non fatal details detail redacted occurred while please try again internal "
    "unknown something went wrong")))


def says_nothing(error: str, tool_names: tuple[str | None, ...] = ()) -> bool:
    """True when ``error`` (lowercase text) holds no word besides the generic ones and the tool's names."""
    known = _SAYS_NOTHING | {n.lower() for n in tool_names if n}
    return all(w in known for w in re.findall(r"[a-z0-9_]+", error))
