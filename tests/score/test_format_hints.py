"""Formats a tool's schema states in words (``score.rules.format_hints``), and the rule that reads them on a
failed tool step whose error says nothing (``tool_args_format``, issue #30 class 3).

The schemas are shaped as the spans carry them: the OpenAI Agents SDK's ``tool.parameters`` (pydantic,
``title``/``type`` per property, no description; the docstring's summary in ``tool.description``,
a Google-style ``Args:`` entry as the property's ``description``), NumPy and Sphinx docstrings as a
tool's description.
"""

from __future__ import annotations

import json

import pytest

from tracedag.pipeline.score.rules.format_hints import broken_arguments, hints_for, says_nothing
from tracedag.pipeline.score.rules.table import StepFacts, score_step
from tracedag.pipeline.score.rules.toolschema import parse_definitions, span_definitions

REDACTED = ("Error running tool (non-fatal): {'tool_name': 'book_taxi', 'error': "
            "'Tool execution failed. Error details are redacted.'}")


def schema(description: str | None = None, **params: str | None) -> dict:
    """A pydantic-made parameters schema (as ``tool.parameters``) with string ``params``, each with
    its own description when given, and the tool's description when given."""
    props = {p: {"title": p.title(), "type": "string", **({"description": d} if d else {})} for p, d in params.items()}
    out = {"properties": props, "required": list(params), "title": "tool_args", "type": "object",
           "additionalProperties": False}
    return {**out, "description": description} if description else out


def broken(value: str, own: str | None = None, tool: str | None = None, param: str = "x") -> str | None:
    """The hint ``value`` breaks as ``param`` (an ``other`` parameter beside it, its value a plain word)."""
    found = broken_arguments({param: value, "other": "plain"}, schema(tool, **{param: own, "other": None}))
    return found.hint if found and found.param == param else None


@pytest.mark.parametrize(("own", "fits", "breaks", "hint"), [
    ("pickup time, HH:MM", "18:30", "around six", "HH:MM"),
    ("HH:MM:SS, local time", "18:30:05", "18:30", "HH:MM:SS"),
    ("the day, YYYY-MM-DD", "2026-12-03", "03/12/2026", "YYYY-MM-DD"),
    ("when, as an ISO 8601 datetime", "2026-12-03T18:30:00Z", "tomorrow evening", "ISO 8601"),
    ("an ISO-8601 date", "2026-12-03", "Dec 3", "ISO 8601"),
    ("the customer's e-mail address", "ann@example.org", "ann at example", "e-mail"),
    ("the page URL", "https://example.org/a?b=1", "example dot org", "URL"),
    ("the size, one of small, medium or large", "medium", "huge", "one of"),
    ("one of 'economy' | 'comfort' | 'van'", "van", "limo", "one of"),
    ("the order number (5 digits)", "12345", "A-1234", "N digits"),
    ("a 6-digit code", "123456", "12345", "N digits"),
    ("the account id, digits only", "00981", "98a", "digits"),
])
def test_each_hint_in_a_parameter_s_own_description(own, fits, breaks, hint):
    assert broken(fits, own=own) is None
    assert broken(breaks, own=own) == hint


@pytest.mark.parametrize("tool", [
    "Book a taxi in a city at a time, HH:MM.",  # the Agents SDK capture's docstring (tool.description)
    "Book a taxi.\n\nArgs:\n    city: the city.\n    time: the pickup time, HH:MM.\n",  # Google
    "Book a taxi.\n\nArgs:\n    time (str): the pickup time in HH:MM format.\n    city (str): the city.\n",  # Google, typed
    "Book a taxi.\n\nParameters\n----------\ntime : str\n    The pickup time,\n    HH:MM.\ncity : str\n    The city.\n",  # NumPy
    "Book a taxi.\n\n:param time: the pickup time, HH:MM\n:param city: the city\n",  # Sphinx
    "book_taxi(city: str, time: str) -> str\nBook a taxi in a city at a pickup time, HH:MM.",  # LlamaIndex: signature first
])
def test_a_hint_about_the_parameter_in_the_tool_s_description(tool):
    assert broken("18:30", tool=tool, param="time") is None
    assert broken("around six", tool=tool, param="time") == "HH:MM"


@pytest.mark.parametrize("tool", [
    "Book a taxi at a pickup moment, HH:MM.",  # names no parameter
    "Book a taxi.\n\nArgs:\n    x: the pickup place.\n    other: the time, HH:MM.\n",  # about another parameter
    "Book a taxi.\n\n:param x: the place\n:param other: the time, HH:MM\n",
    "Book a taxi in x, then return its id as 5 digits.",  # not right after "x,"
    "Book a taxi; x: the time the user said, in their own words.",  # no recognised format
])
def test_a_hint_not_clearly_about_the_parameter_changes_nothing(tool):
    assert broken("around six", tool=tool) is None


def test_a_hint_about_another_parameter_is_not_applied_to_this_one():
    s = schema(x=None, other="pickup time, HH:MM")
    assert hints_for("x", s) == []
    assert broken_arguments({"x": "around six", "other": "18:30"}, s) is None
    assert broken_arguments({"x": "18:30", "other": "around six"}, s).param == "other"


def test_unrecognised_hints_and_values_that_are_not_strings_change_nothing():
    assert broken("around six", own="a time the driver understands") is None
    assert broken("next week", own="a date in the format the user prefers") is None
    s = schema(x="pickup time, HH:MM")
    assert broken_arguments({"x": 1830}, s) is None and broken_arguments(["around six"], s) is None


def test_several_hints_a_value_fitting_any_fits():
    assert broken("2026-12-03T18:30", own="YYYY-MM-DD or an ISO 8601 datetime") is None
    assert broken("Thursday", own="YYYY-MM-DD or an ISO 8601 datetime") == "YYYY-MM-DD"


def test_an_error_says_nothing_when_redacted_or_generic():
    assert says_nothing(REDACTED.lower(), ("book_taxi",))
    assert says_nothing("an error occurred while running the tool. please try again.")
    assert says_nothing("")
    assert not says_nothing("valueerror: time must be hh:mm, got 'around six'", ("book_taxi",))
    assert not says_nothing("weather backend timed out after 10s")


def test_the_tool_s_description_reaches_the_schema_from_the_spans():
    # the Agents SDK capture's book_taxi span (OpenInference tool.name / tool.description / tool.parameters)
    params = schema(None, city=None, time=None)
    entries = [("tool.name", "book_taxi"), ("tool.description", "Book a taxi in a city at a time, HH:MM."),
               ("tool.parameters", json.dumps(params))]
    _, bare = span_definitions(entries)
    assert bare["book_taxi"]["description"] == "Book a taxi in a city at a time, HH:MM."
    # an OpenAI-form definition given to the model (llm.tools.N.tool.json_schema)
    fn = {"type": "function", "function": {"name": "book_taxi", "description": "time: HH:MM", "parameters": params}}
    assert parse_definitions(json.dumps(fn))["book_taxi"]["description"] == "time: HH:MM"
    # a schema's own description is kept
    own = parse_definitions(json.dumps({**fn, "function": {**fn["function"], "parameters": schema("mine", time=None)}}))
    assert own["book_taxi"]["description"] == "mine"


def tool_step(message: str | None, args: str = '{"city": "Paris", "time": "around six"}', failed: bool = True) -> StepFacts:
    return StepFacts("t", "s", step_type="tool", step_name="book_taxi", tool_name="book_taxi",
                     status_code=2 if failed else 1, status_message=message, tool_args=args,
                     tool_schema=schema("Book a taxi in a city at a time, HH:MM.", city=None, time=None))


def arguments_row(f: StepFacts):
    return {r.metric: r for r in score_step(f)}["arguments"]


def test_a_failed_step_with_a_redacted_error_and_a_broken_format_fails_on_its_arguments():
    row = arguments_row(tool_step(REDACTED))
    assert (row.rule_name, row.score) == ("tool_args_format", 2.0)
    assert "time: 'around six' is not HH:MM" in row.explanation


@pytest.mark.parametrize(("facts", "why"), [
    (tool_step(REDACTED, '{"city": "Paris", "time": "18:00"}'), "the value fits"),
    (tool_step(None, failed=False), "the step passed"),
    (tool_step("ConnectionError: taxi backend connection reset"), "the error says what failed"),
])
def test_no_format_row_when_the_value_fits_the_step_passed_or_the_error_speaks(facts, why):
    assert arguments_row(facts).rule_name != "tool_args_format", why
