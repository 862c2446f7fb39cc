"""The value rule of value provenance (pipeline/score/provenance.py): which argument values are traced."""

from __future__ import annotations

import pytest

from tracedag.pipeline.score.provenance import appears, argument_values, matchable


@pytest.mark.parametrize("value", [
    "1Z999AA10123456784", "A1042", "ORD-7", "2026-05-03", "1042", "-12.5", "https://api.example.com/orders/7",
    "order_abc", "jane.doe@example.com", "customerId", "s3://bucket/key",
])
def test_specific_values_are_traced(value: str) -> None:
    assert matchable(value)


@pytest.mark.parametrize("value", [
    "paris", "Pending", "express", "north", "42", "7", "1.5", "A17", "", "  ", "utf-8", "gpt-4o-mini", "true",
    "two words 1042", "x" * 600 + "1",
])
def test_common_words_and_short_numbers_are_not(value: str) -> None:
    assert not matchable(value)


def test_argument_values_are_the_json_leaves_that_match() -> None:
    text = '{"tracking_no": "1Z999AA1", "carrier": "ups", "n": 42, "ids": [1042, 7], "opts": {"ref": "R-2026"}, "ok": true}'
    assert argument_values(text) == [("tracking_no", "1Z999AA1"), ("ids[0]", "1042"), ("opts.ref", "R-2026")]
    assert argument_values("A1042") == [("input", "A1042")]
    assert argument_values("paris") == []
    assert argument_values(None) == []


def test_a_value_appears_only_as_a_whole_token() -> None:
    assert appears("1042", "order 1042 shipped")
    assert appears("A1042", '{"order_id": "A1042"}')
    assert not appears("1042", "order 10420 shipped")
    assert not appears("A1042", "XA1042")
    assert not appears("a1042", "A1042")  # verbatim: case matters
