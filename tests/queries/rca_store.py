"""Fixture store for issue 18's root-cause cases: turns of a conversation, cancelled siblings,
recovery by another route, a failure behind a passing step. Expected rows are worked out by hand
in tests/queries/test_rca.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.queries.query_fixtures import Score, Step, Trace, write_store

# conv-a, turn 1: the tool fails, the model answers around it (c2 passes, the agent passes).
A1 = Trace(
    "a1-lookup", 0,
    [Step("ra", None, "assistant", 0, 100, "agent"), Step("c1", "ra", "chat", 0, 10, "llm"),
     Step("tl", "ra", "lookup_order", 11, 20, input_text='{"order_id": "A17"}', error_type="OrderError"),
     Step("c2", "ra", "chat", 21, 30, "llm")],
    sequence=[("c1", "tl"), ("tl", "c2")],
    scores=[Score("ra", 5.0), Score("c1", 5.0), Score("c2", 5.0),
            Score("tl", 1.0, taxonomy_l1="execution", taxonomy_l3="tool_error")],
    conversation_id="conv-a",
)
# conv-a, turn 2: the agent raises outside any tool span (the order was never fetched).
A2 = Trace(
    "a2-agent", 1000,
    [Step("rb", None, "assistant", 0, 50, "agent", error_type="KeyError"), Step("d1", "rb", "chat", 5, 20, "llm")],
    scores=[Score("rb", 1.0, taxonomy_l1="execution", taxonomy_l3="unhandled_exception"), Score("d1", 5.0)],
    conversation_id="conv-a",
)
# conv-b, turn 1: a tool fails; turn 2: the model provider answers 500 (the environment's failure).
B1 = Trace(
    "b1-fetch", 2000,
    [Step("rc", None, "assistant", 0, 40, "agent"), Step("fe1", "rc", "fetch", 5, 15)],
    scores=[Score("rc", 5.0), Score("fe1", 1.0, taxonomy_l1="execution", taxonomy_l3="tool_error")],
    conversation_id="conv-b",
)
B2 = Trace(
    "b2-outage", 3000,
    [Step("rd", None, "assistant", 0, 40, "agent"), Step("m", "rd", "chat", 5, 15, "llm")],
    scores=[Score("rd", 1.0, taxonomy_l1="execution", taxonomy_l3="http_error"),
            Score("m", 1.0, taxonomy_l1="execution", taxonomy_l3="http_error")],
    conversation_id="conv-b",
)
# parallel branches: b fails, a and c (and c's child c1) are cancelled; a starts first.
CANCEL = Trace(
    "t-cancel", 4000,
    [Step("r", None, "assistant", 0, 100, "agent", error_type="ExceptionGroup"),
     Step("a", "r", "fetch_a", 10, 60, error_type="asyncio.exceptions.CancelledError"),
     Step("b", "r", "fetch_b", 12, 50, error_type="ValueError", status_message="ValueError: bad sku"),
     Step("c", "r", "fetch_c", 14, 61, "chain", status_message="CancelledError: "),
     Step("c1", "c", "fetch_c_inner", 20, 61, error_type="context.Canceled")],
    scores=[Score("r", 1.0), Score("a", 1.0), Score("b", 1.0), Score("c", 1.0), Score("c1", 1.0)],
)
# another route: get_weather fails, get_weather_cached serves the same request, the answer passes.
FALLBACK = Trace(
    "t-fallback", 5000,
    [Step("rf", None, "assistant", 0, 100, "agent"), Step("m1", "rf", "chat", 0, 10, "llm"),
     Step("w", "rf", "get_weather", 11, 20, input_text='{"city": "Paris"}', error_type="TimeoutError"),
     Step("m2", "rf", "chat", 21, 30, "llm"),
     Step("k", "rf", "get_weather_cached", 31, 40, input_text='{"city": "paris", "max_age": 600}'),
     Step("m3", "rf", "chat", 41, 50, "llm")],
    sequence=[("m1", "w"), ("w", "m2"), ("m2", "k"), ("k", "m3")],
    scores=[Score("rf", 5.0), Score("m1", 5.0), Score("m2", 5.0), Score("m3", 5.0), Score("k", 5.0),
            Score("w", 1.0, taxonomy_l3="timeout")],
)


def _variant(trace_id: str, offset: int, tool: str, args: str, parent_score: float = 5.0) -> Trace:
    t = Trace(trace_id, offset, [Step(s.span_id, s.parent, s.name, s.start_ms, s.end_ms, s.step_type,
                                      input_text=s.input_text, error_type=s.error_type) for s in FALLBACK.steps],
              sequence=FALLBACK.sequence, scores=[Score(s.span_id, s.score, taxonomy_l3=s.taxonomy_l3)
                                                  for s in FALLBACK.scores if s.span_id != "rf"])
    t.steps[4] = Step("k", "rf", tool, 31, 40, input_text=args)
    t.scores.append(Score("rf", parent_score, source="judge"))
    return t


# the later tool carries the city but serves another purpose (no shared name word)
OTHER_PURPOSE = _variant("t-other-purpose", 6000, "get_news", '{"topic": "Paris"}')
# the same kind of tool, for another city
OTHER_ARGS = _variant("t-other-args", 7000, "get_weather_cached", '{"city": "Rome"}')
# the fallback worked but the answer fails
BAD_ANSWER = _variant("t-bad-answer", 8000, "get_weather_cached", '{"city": "Paris"}', parent_score=2.0)
# A fails, the model step B passes, C fails: greedy goes through B, AgentEval does not.
PASSING = Trace(
    "t-passing", 9000,
    [Step("rp", None, "assistant", 0, 50, "agent"), Step("pa", "rp", "search", 10, 20),
     Step("pb", "rp", "chat", 21, 30, "llm"), Step("pc", "rp", "book", 31, 40)],
    sequence=[("pa", "pb"), ("pb", "pc")],
    scores=[Score("rp", 5.0), Score("pa", 1.0), Score("pb", 5.0), Score("pc", 2.0)],
)

ALL = [A1, A2, B1, B2, CANCEL, FALLBACK, OTHER_PURPOSE, OTHER_ARGS, BAD_ANSWER, PASSING]


@pytest.fixture(scope="session")
def rca_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data directory holding the issue-18 fixture traces."""
    return write_store(tmp_path_factory.mktemp("rcastore"), ALL)
