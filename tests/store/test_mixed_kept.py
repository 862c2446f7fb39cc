"""Issue 31: a poll while traces wait to be stored reads the rows ``store.mixed`` computed for them before when
they come from the same files (``store.mixedkept``), and computes a conversation's again when a file holding one of
its traces changed (a new round's, a later turn, a late span), or every one when a file of another table did. Every
answer is the SQL's over every trace."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.queries.test_materialized import CASES, _exact, four_stored_conversations, references
from tests.score.score_support import agent_turn
from tracedag.pipeline.dag.build import build_store
from tracedag.pipeline.score.runner import LiveRound, score_store
from tracedag.pipeline.store import mixed, mixedkept, querying
from tracedag.pipeline.store.querying import run_named, run_named_together


@pytest.fixture(autouse=True)
def _forgotten(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    mixedkept.forget()
    monkeypatch.setattr(mixedkept, "KEEP_FIRST", True)  # a process's first read keeps too (test_first_read_...)
    yield
    mixedkept.forget()


class Computed:
    """Counts the times ``store.mixed`` restricted views to compute rows (``mixed._restrict``), and the traces of
    the last time."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.times = 0
        self.scope: tuple[str, ...] = ()
        restrict = mixed._restrict

        def counted(*args: Any, **kwargs: Any) -> tuple[str, ...]:
            self.times += 1
            self.scope = args[2]
            return restrict(*args, **kwargs)
        monkeypatch.setattr(mixed, "_restrict", counted)


def _round(data: Path, spans: list[dict[str, Any]], b: Any) -> None:
    """A live round: ``spans`` built and scored, not stored."""
    b.spans(spans)
    built = build_store(data, idle_seconds=0)
    score_store(data, live=LiveRound(built.build_id, built.received_from, materialize=False))


def _answers(data: Path) -> list[list[dict[str, object]]]:
    return [_exact(run_named(data, name, given).to_pylist()) for name, given in CASES]


def test_a_poll_of_the_same_files_reads_the_rows_computed_before(
        tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    b = four_stored_conversations(tmp_path_factory, data)
    _round(data, agent_turn("u1", "conv-u1", 9_800_000, "plan"), b)
    computed = Computed(monkeypatch)
    want = references(data, CASES)
    assert _answers(data) == want
    first = computed.times
    assert first >= len(CASES) - 1  # each case computed once (per=conversation reads the same rows: not kept)
    assert _answers(data) == want and computed.times == first  # the same files: nothing computed again
    together = run_named_together(data, [(name, given) for name, given in CASES])  # computes them (its views)
    assert [_exact(t.to_pylist()) for t in together] == want and computed.times > first
    first = computed.times
    assert _answers(data) == want and computed.times == first

    # spans of a trace not built yet: no file holding a waiting trace changed, the rows are kept
    b.spans(agent_turn("n1", "conv-n1", 9_900_000, "plan"))
    assert _answers(data) == references(data, CASES) and computed.times == first


def test_a_new_round_a_late_span_or_another_table_s_file_computes_them_again(
        tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    b = four_stored_conversations(tmp_path_factory, data)
    _round(data, agent_turn("u1", "conv-u1", 9_800_000, "plan"), b)
    computed = Computed(monkeypatch)
    assert _exact(run_named(data, "root_causes").to_pylist()) == references(data, [("root_causes", {})])[0]
    assert computed.times == 1

    # a new round: another conversation waits, with a root cause of its own; u1's rows are kept (its files are)
    _round(data, agent_turn("v1", "conv-v1", 9_900_000, "fetch"), b)
    got = _exact(run_named(data, "root_causes").to_pylist())
    assert got == references(data, [("root_causes", {})])[0] and computed.times == 2 and computed.scope == ("v1",)
    assert {r["trace_id"] for r in got} >= {"u1", "v1"}

    # a build of a new conversation, not scored yet: it has no row of root_causes, every other's rows are kept
    b.spans(agent_turn("w1", "conv-w1", 9_920_000, "plan"))
    build_store(data, idle_seconds=0)
    calls: list[object] = []
    real = querying.connect
    monkeypatch.setattr(querying, "connect", lambda *a, **k: calls.append(k.get("tables")) or real(*a, **k))
    assert _exact(run_named(data, "root_causes").to_pylist()) == references(data, [("root_causes", {})])[0]
    assert computed.times == 2 and None not in calls  # no connection made with every view
    monkeypatch.setattr(querying, "connect", real)

    # a later turn of u1's conversation, built not scored: no failing score of its own, but the conversation's rows
    # (its turns) are computed again
    b.spans(agent_turn("u2", "conv-u1", 9_950_000, "plan"))
    build_store(data, idle_seconds=0)
    assert _exact(run_named(data, "root_causes").to_pylist()) == references(data, [("root_causes", {})])[0]
    assert computed.times == 3 and computed.scope == ("u1", "u2")

    # a late span of a waiting trace (not built again yet): a file holding it is new
    late = agent_turn("v1", "conv-v1", 9_900_500, "fetch")[2] | {"span_id": "v1-late"}
    b.spans([late])
    assert _exact(run_named(data, "root_causes").to_pylist()) == references(data, [("root_causes", {})])[0]
    assert computed.times == 4 and computed.scope == ("v1",)

    # a file of another table (an evaluation) changes every conversation's key
    b.evaluations([{"trace_id": "a1", "name": "helpfulness", "score_value": 4.0}])
    assert _exact(run_named(data, "root_causes").to_pylist()) == references(data, [("root_causes", {})])[0]
    assert computed.times == 5 and computed.scope == ("u1", "u2", "v1")
    assert _exact(run_named(data, "root_causes").to_pylist()) == references(data, [("root_causes", {})])[0]
    assert computed.times == 5


def test_a_process_s_first_read_of_a_store_keeps_nothing_its_second_does(
        tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    b = four_stored_conversations(tmp_path_factory, data)
    _round(data, agent_turn("u1", "conv-u1", 9_800_000, "plan"), b)
    monkeypatch.setattr(mixedkept, "KEEP_FIRST", False)
    computed = Computed(monkeypatch)
    want = references(data, [("root_causes", {})])[0]
    for times in (1, 2, 2):  # a one-shot query reads no file's trace ids; a poller keeps from its second read
        assert _exact(run_named(data, "root_causes").to_pylist()) == want and computed.times == times
