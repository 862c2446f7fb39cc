"""Argument canonicalization: key order, whitespace, numbers."""

from __future__ import annotations

import pytest

from tracedag.pipeline.analysis.canonical import action_with_input, canonical_args


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ('{"q": "X", "n": 1}', '{"n":1,"q":"X"}'),  # key order and JSON whitespace
        ('{"n": 1.0}', '{"n": 1}'),  # whole floats are integers
        ('{"n": 1e0}', '{"n": 1}'),
        ('{"q": "  new   york "}', '{"q":"new york"}'),  # whitespace inside strings
        ('{"a": {"y": [1.0, 2], "x": null}}', '{"a":{"x":null,"y":[1,2]}}'),  # nested
        ("{'q': 'X', 'n': 2}", '{"n": 2, "q": "X"}'),  # Python-literal form
        ("  plain   text ", "plain text"),  # not JSON at all
    ],
)
def test_equal_after_canonicalization(a, b):
    assert canonical_args(a) == canonical_args(b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ('{"n": 1.5}', '{"n": 1}'),
        ('{"q": "X"}', '{"q": "x"}'),  # case is meaningful
        ('{"n": "1"}', '{"n": 1}'),  # a string is not a number
        ('{"b": true}', '{"b": 1}'),  # a boolean is not a number
        ('[1, 2]', '[2, 1]'),  # list order is meaningful
    ],
)
def test_different_stay_different(a, b):
    assert canonical_args(a) != canonical_args(b)


def test_exact_forms():
    assert canonical_args('{ "b": 2.50, "a": [ 1.0 ] }') == '{"a":[1],"b":2.5}'
    assert canonical_args(None) == ""
    assert canonical_args("   ") == ""
    assert action_with_input("KB", '{"q": "X"}') == 'KB({"q":"X"})'
    assert action_with_input("ping", None) == "ping()"
