"""Issue 31: the rows of the conversations waiting to be stored, computed after a round by the collector
(``store.mixed.prepare_wanted``) for the queries readers asked about, are written where every process reads them
(``store.mixedfile``): a poll of another process then computes nothing. A conversation whose files changed since (a
new round, a late span), a file of another table, or a damaged file are computed as before. Every answer is the
SQL's over every trace."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.queries.test_materialized import _exact, four_stored_conversations, references
from tests.score.score_support import agent_turn
from tests.store.test_mixed_kept import Computed, _round
from tracedag.pipeline.dag.build import build_store
from tracedag.pipeline.store import mixed, mixedfile, mixedkept, querying
from tracedag.pipeline.store.querying import run_named

ROOT_CAUSES = [("root_causes", {})]


@pytest.fixture(autouse=True)
def _forgotten() -> Iterator[None]:
    mixedkept.forget()
    yield
    mixedkept.forget()
    if mixed.POLLS.current is not None:
        mixed.POLLS.drop(mixed.POLLS.current[2])


def _poll(data: Path) -> list[dict[str, object]]:
    """A poll of another process than the collector: it knows nothing this process kept."""
    mixedkept.forget()
    return _exact(run_named(data, "root_causes").to_pylist())


def _with_every_view(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The ``tables`` of each connection ``run_named`` makes (None: one with every view)."""
    calls: list[object] = []
    real = querying.connect
    monkeypatch.setattr(querying, "connect", lambda *a, **k: calls.append(k.get("tables")) or real(*a, **k))
    return calls


def test_rows_the_collector_wrote_answer_another_process_s_poll_without_computing(
        tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    b = four_stored_conversations(tmp_path_factory, data)
    _round(data, agent_turn("u1", "conv-u1", 9_800_000, "plan"), b)
    assert mixed.prepare_wanted(data) == 0 and not (data / "state" / mixedfile.DIR).exists()  # nobody polled
    computed = Computed(monkeypatch)
    want = references(data, ROOT_CAUSES)[0]
    assert _poll(data) == want and computed.times == 1  # a process's first poll: computed, and the query wanted
    assert [n for n, _ in mixedfile.wanted(data)] == ["root_causes"]

    assert mixed.prepare_wanted(data) > 0 and computed.times == 2  # the collector, after the round
    calls = _with_every_view(monkeypatch)
    assert _poll(data) == want and computed.times == 2 and None not in calls  # read, not computed: no view of all
    assert _poll(data) == want and computed.times == 2

    # a new round: v1 waits too; the poll computes v1 alone (u1's rows are read), the collector then writes both
    _round(data, agent_turn("v1", "conv-v1", 9_900_000, "fetch"), b)
    want = references(data, ROOT_CAUSES)[0]
    assert {r["trace_id"] for r in want} >= {"u1", "v1"}
    assert _poll(data) == want and computed.times == 3 and computed.scope == ("v1",)
    mixedkept.forget()  # the collector computes v1 too, not u1
    assert mixed.prepare_wanted(data) > 0 and computed.times == 4 and computed.scope == ("v1",)
    assert _poll(data) == want and computed.times == 4

    # a build of a conversation not scored yet: no key changed, the file stays as it is and answers
    b.spans(agent_turn("w1", "conv-w1", 9_920_000, "plan"))
    build_store(data, idle_seconds=0)
    rows = mixedfile.rows_path(data, _query(data))
    before = rows.stat().st_mtime_ns
    assert mixed.prepare_wanted(data) > 0 and computed.times == 4 and rows.stat().st_mtime_ns == before
    assert _poll(data) == references(data, ROOT_CAUSES)[0] and computed.times == 4

    # a late span of v1: its key is new, the file's rows for it are not taken
    late = agent_turn("v1", "conv-v1", 9_900_500, "fetch")[2] | {"span_id": "v1-late"}
    b.spans([late])
    assert _poll(data) == references(data, ROOT_CAUSES)[0] and computed.times == 5 and computed.scope == ("v1",)

    # a file of another table (an evaluation): every key is new, and the file is not for what a first read sees (it
    # computes as without one, reading no file's trace ids)
    b.evaluations([{"trace_id": "a1", "name": "helpfulness", "score_value": 4.0}])
    assert _poll(data) == references(data, ROOT_CAUSES)[0] and computed.times == 6
    assert computed.scope == ("u1", "v1", "w1") and not mixedkept._IDS
    assert mixed.prepare_wanted(data) > 0 and computed.times == 7 and computed.scope == ("u1", "v1")
    assert _poll(data) == references(data, ROOT_CAUSES)[0] and computed.times == 7


def _query(data: Path) -> str:
    """The digest of ``root_causes`` with its default values on ``data`` (its ``mixedfile`` files' name)."""
    (found,) = [p.stem for p in (data / "state" / mixedfile.DIR).glob("*.want")]
    return found


def test_a_damaged_or_old_rows_file_is_not_read(
        tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    b = four_stored_conversations(tmp_path_factory, data)
    _round(data, agent_turn("u1", "conv-u1", 9_800_000, "plan"), b)
    want = references(data, ROOT_CAUSES)[0]
    assert _poll(data) == want
    assert mixed.prepare_wanted(data) > 0
    rows = mixedfile.rows_path(data, _query(data))
    computed = Computed(monkeypatch)
    rows.write_bytes(rows.read_bytes()[:100])  # cut short
    assert _poll(data) == want and computed.times == 1
    rows.write_bytes(b"not arrow")
    assert _poll(data) == want and computed.times == 2

    assert mixed.prepare_wanted(data) > 0 and computed.times == 3  # written again
    assert _poll(data) == want and computed.times == 3

    # no reader asked for WANT_SECONDS: the collector removes the query and its rows
    old = rows.with_suffix(".want").stat().st_mtime - mixedfile.WANT_SECONDS - 1
    os.utime(rows.with_suffix(".want"), (old, old))
    assert mixed.prepare_wanted(data) == 0 and not rows.exists() and not rows.with_suffix(".want").exists()


def test_values_json_cannot_give_back_are_not_wanted(tmp_path: Path) -> None:
    (tmp_path / "tables").mkdir()
    mixedfile.want(tmp_path, "q1", "root_causes", {"fail_threshold": 0.5})
    mixedfile.want(tmp_path, "q2", "root_causes", {"when": (1, 2)})  # a tuple: JSON gives a list
    assert mixedfile.wanted(tmp_path) == [("root_causes", {"fail_threshold": 0.5})]
