"""The price-list macros of queries/_costs.sql (model_prices, span_costs) on a hand-built store."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.queries.query_fixtures import Step, Trace, write_store
from tracedag.pipeline.store.views import connect

PRICED = Trace(
    "t-priced", 0,
    [Step("r", None, "agent", 0, 100, "agent"),  # no tokens: no row
     Step("a", "r", "answer", 1, 2, "llm", model="GPT-4o-2024-08-06", input_tokens=1000, output_tokens=200),
     Step("b", "r", "draft", 3, 4, "llm", model="gpt-4o-mini-2024-07-18", input_tokens=2000, output_tokens=1000),
     Step("c", "r", "classify", 5, 6, "llm", model="claude-3-5-haiku-20241022", input_tokens=4000),
     Step("d", "r", "local", 7, 8, "llm", model="my-local-llama", input_tokens=500, output_tokens=100),
     Step("e", "r", "unnamed", 9, 10, "llm", output_tokens=300),
     Step("f", "r", "plan", 11, 12, "llm", model="gpt-4.1-mini", input_tokens=10_000, output_tokens=5000),
     Step("g", "r", "noop", 13, 14, "llm", model="gpt-4o", input_tokens=0, output_tokens=0)],
)
OTHER = Trace("t-other", 1000, [Step("o", None, "agent", 0, 10, "llm", model="o1", input_tokens=1, output_tokens=1)])

# (span, input_tokens, output_tokens, input price, output price, cost USD), worked out by hand, with
# default prices 2.0 / 6.0 USD per 1M tokens for a model the list does not know:
# a  'gpt-4o' (lower-cased name) 2.50 / 10.00: (1000 * 2.5 + 200 * 10) / 1e6 = 4500 / 1e6
# b  'gpt-4o-mini' (11 chars) beats 'gpt-4o' (6) 0.15 / 0.60: (2000 * 0.15 + 1000 * 0.6) / 1e6 = 900 / 1e6
# c  'claude-3-5-haiku' 0.80 / 4.00, no output tokens count 0: 4000 * 0.8 / 1e6 = 3200 / 1e6
# d  no list name in 'my-local-llama': defaults, (500 * 2 + 100 * 6) / 1e6 = 1600 / 1e6
# e  no model: defaults, 300 * 6 / 1e6 = 1800 / 1e6
# f  'gpt-4.1-mini' (12) beats 'gpt-4.1' (7) 0.40 / 1.60: (10000 * 0.4 + 5000 * 1.6) / 1e6 = 12000 / 1e6
# g  zero tokens (not null): a row, cost 0
EXPECTED = {
    "a": (1000, 200, 2.50, 10.00, 4500e-6),
    "b": (2000, 1000, 0.15, 0.60, 900e-6),
    "c": (4000, 0, 0.80, 4.00, 3200e-6),
    "d": (500, 100, 2.0, 6.0, 1600e-6),
    "e": (0, 300, 2.0, 6.0, 1800e-6),
    "f": (10_000, 5000, 0.40, 1.60, 12000e-6),
    "g": (0, 0, 2.50, 10.00, 0.0),
}


def _costs(data: Path, trace_ids: list[str], default_in: float, default_out: float) -> dict[str, tuple[object, ...]]:
    con = connect(data)
    try:
        got = con.execute(
            "select span_id, input_tokens, output_tokens, input_per_mtok, output_per_mtok, cost_usd "
            "from span_costs($ids::varchar[], $din, $dout)",
            {"ids": trace_ids, "din": default_in, "dout": default_out}).fetchall()
    finally:
        con.close()
    return {r[0]: tuple(r[1:]) for r in got}


@pytest.fixture(scope="module")
def cost_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_store(tmp_path_factory.mktemp("costs"), [PRICED, OTHER])


def test_span_costs_hand_worked(cost_store: Path) -> None:
    got = _costs(cost_store, ["t-priced"], 2.0, 6.0)
    assert set(got) == set(EXPECTED)  # r has no tokens; t-other is not in the list
    for span, (tin, tout, pin, pout, cost) in EXPECTED.items():
        assert got[span][:2] == (tin, tout), span
        assert got[span][2:] == (pytest.approx(pin), pytest.approx(pout), pytest.approx(cost, abs=1e-15)), span


def test_span_costs_default_prices_are_parameters(cost_store: Path) -> None:
    got = _costs(cost_store, ["t-priced", "t-other"], 0.0, 0.0)
    assert got["d"][4] == 0.0 and got["e"][4] == 0.0  # unknown model / no model: free by default
    assert got["a"][4] == pytest.approx(4500e-6)  # listed models keep their list price
    assert got["o"][4] == pytest.approx((15.0 + 60.0) / 1e6)  # 'o1' 15 / 60


def test_model_prices_is_the_list(cost_store: Path) -> None:
    con = connect(cost_store)
    try:
        rows = con.execute("select model_key, input_per_mtok, output_per_mtok from model_prices()").fetchall()
    finally:
        con.close()
    keys = [r[0] for r in rows]
    assert len(keys) == len(set(keys)) == 17
    assert all(k == k.lower() for k in keys)
    assert ("gemini-1.5-flash", pytest.approx(0.075), pytest.approx(0.30)) in [tuple(r) for r in rows]
