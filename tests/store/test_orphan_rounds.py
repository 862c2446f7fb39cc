"""Issue 31: a scoring round killed between its rows and its state rows leaves rows no reader takes; the
collection (``tracedag build --compact``, a collector's collection: ``swap.collect``) drops them, and only them.

The rounds are killed for real: a ``tracedag score`` process whose ``_write_state`` exits at once
(``os._exit(9)``, no cleanup, like SIGKILL) through a ``sitecustomize`` on its PYTHONPATH. The commands after a
kill (the next round, the compacting build) run in this process (click's runner): the store, not a process, is
what they have to find as the killed round left it; the scorers racing the collections stay processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from tests.queries.test_materialized import CASES, _exact, assert_materialized_equal, materialized_answers
from tests.replay.replay_support import in_process
from tests.score.score_support import StoreBuilder, agent_turn
from tracedag.pipeline.dag.build import build_store
from tracedag.pipeline.score.runner import score_store
from tracedag.pipeline.store import materialized
from tracedag.pipeline.store.gc import GcSettings, GcStats, liveness
from tracedag.pipeline.store.querying import run_named
from tracedag.pipeline.store.swap import collect_scored
from tracedag.pipeline.store.views import connect

RESULTS = tuple(materialized.table_name(n) for n in materialized.SPECS)
NO_GC = GcSettings(enabled=False)
KILL = "TRACEDAG_TEST_KILL_AT_STATE"
HOOK = f'''
import os
if os.environ.get("{KILL}"):
    from tracedag.pipeline.score import materialize as _m
    _calls = [0]
    _real = _m._write_state

    def _write_state(data, state):
        _calls[0] += 1
        if _calls[0] >= int(os.environ["{KILL}"]):
            os._exit(9)  # killed after the round's rows, before its state rows
        _real(data, state)

    _m._write_state = _write_state
'''


def _tracedag(data: Path, tmp: Path, command: str, *args: str, kill_at: int | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real ``tracedag`` CLI's ``command`` (words) on ``data``; ``kill_at``: the process dies at that call of
    ``_write_state``."""
    hook = tmp / "hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(HOOK, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hook), *filter(None, [os.environ.get("PYTHONPATH")])])}
    env.pop(KILL, None)
    if kill_at is not None:
        env[KILL] = str(kill_at)
    cmd = [sys.executable, "-c", "from tracedag.pipeline.cli import cli; cli()", *command.split(), "--data", str(data), *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def _here(data: Path, command: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``tracedag COMMAND --data DATA ARGS`` in this process (a process of its own costs ~0.6 s of imports)."""
    return in_process(*command.split(), "--data", str(data), *args)


def _one(data: Path, sql: str) -> tuple:
    con = connect(data)
    try:
        return tuple(con.execute(sql).fetchall()[0])
    finally:
        con.close()


def _orphans(data: Path) -> dict[str, tuple[int, int]]:
    """Per result table: (rows, distinct rounds) whose round no state row names."""
    con = connect(data)
    try:
        return {t: tuple(con.execute(f"select count(*), count(distinct mat_round) from {t} where mat_round not in "
                                     f"(select mat_round from {materialized.STATE})").fetchall()[0]) for t in RESULTS}
    finally:
        con.close()


def _newest_rows(data: Path) -> dict[str, list[tuple]]:
    """Per result table: its rows of each trace's newest stored round (what readers take), sorted."""
    out = {}
    con = connect(data)
    try:
        for t in RESULTS:
            out[t] = con.execute(f"""
                select x.* from {t} x join (select trace_id, max(mat_round) as newest
                                            from {materialized.STATE} group by trace_id) n
                on x.trace_id = n.trace_id and x.mat_round = n.newest order by all""").fetchall()
    finally:
        con.close()
    return out


def _answers(data: Path) -> list[list[dict[str, object]]]:
    return [_exact(run_named(data, name, given).to_pylist()) for name, given in CASES]


def _compact_and_check(data: Path, orphaned: int) -> str:
    """``tracedag build --compact``: the orphaned rows go, what readers take stays, the answers equal the SQL's."""
    kept, answers = _newest_rows(data), _answers(data)  # the orphaned rows are there, and no reader takes them
    out = _here(data, "build", "--idle", "0", "--compact")
    assert out.returncode == 0, out.stderr
    printed = [int(line.split("orphaned rounds: ")[1].split()[0]) for line in out.stdout.splitlines()
               if "orphaned rounds: " in line]
    assert sum(printed) == orphaned, out.stdout
    assert _orphans(data) == {t: (0, 0) for t in RESULTS}
    assert _newest_rows(data) == kept
    assert materialized_answers(data) == answers  # the stored rows answer, as the SQL does, what they did before
    return out.stdout


def test_a_round_killed_before_its_state_rows_leaves_rows_the_collection_drops(tmp_path):
    data = tmp_path / "data"
    sb = StoreBuilder(data)
    sb.spans(agent_turn("solo", "conv-solo", 500_000, "fetch") + agent_turn("t0", "conv-1", 1_000_000, "search"))
    build_store(data, idle_seconds=0, gc=NO_GC)
    score_store(data)
    sb.spans(agent_turn("t1", "conv-1", 2_000_000, "search"))  # a later turn: its round stores both turns again
    build_store(data, idle_seconds=0, gc=NO_GC)

    killed = _tracedag(data, tmp_path, "score", "--no-progress", kill_at=1)
    assert killed.returncode == 9, killed.stderr
    orphans = _orphans(data)
    assert orphans["materialized_failures"] == (2, 1)  # both turns' failing tools, one round
    assert orphans["materialized_trace_summary"] == (2, 1)

    done = _here(data, "score", "--no-progress")  # the next round stores the turns left pending
    assert done.returncode == 0, done.stderr
    assert _orphans(data) == orphans  # a later round does not take them either

    stdout = _compact_and_check(data, sum(n for n, _ in orphans.values()))
    assert "gc materialized_failures:" in stdout


def test_a_round_in_parts_killed_before_its_one_state_file_leaves_every_part_orphaned(tmp_path):
    data = tmp_path / "data"
    sb = StoreBuilder(data)
    sb.spans([s for i in range(4) for s in agent_turn(f"t{i}", f"conv-{i}", 1_000_000 * (i + 1), "search")])
    build_store(data, idle_seconds=0, gc=NO_GC)
    score_store(data)
    labels = tmp_path / "labels.csv"  # new human labels: the next round stores every trace again, part by part
    labels.write_text("trace_id,span_id,metric,score,annotator\nt0,t0-t,quality,1,ann\n", encoding="utf-8")
    assert _here(data, "labels import", str(labels)).returncode == 0

    killed = _tracedag(data, tmp_path, "score", "--no-progress", "--materialize-part", "1", kill_at=1)
    assert killed.returncode == 9, killed.stderr
    assert _orphans(data)["materialized_failures"] == (4, 4)  # one part a conversation, each its own round

    done = _here(data, "score", "--no-progress", "--materialize-part", "1")
    assert done.returncode == 0, done.stderr
    orphans = _orphans(data)
    assert orphans["materialized_failures"] == (4, 4)
    _compact_and_check(data, sum(n for n, _ in orphans.values()))


def test_the_store_first_round_in_parts_killed_midway_keeps_the_parts_it_stored(tmp_path):
    data = tmp_path / "data"
    StoreBuilder(data).spans([s for i in range(3) for s in agent_turn(f"t{i}", f"conv-{i}", 1_000_000 * (i + 1), "x")])
    build_store(data, idle_seconds=0, gc=NO_GC)
    killed = _tracedag(data, tmp_path, "score", "--no-progress", "--materialize-part", "1", kill_at=2)
    assert killed.returncode == 9, killed.stderr
    assert _one(data, f"select count(*) from {materialized.STATE}") == (1,)  # the first part's state landed
    assert _orphans(data)["materialized_failures"] == (1, 1)  # the second part's rows have none
    done = _here(data, "score", "--no-progress", "--materialize-part", "1")
    assert done.returncode == 0, done.stderr
    _compact_and_check(data, sum(n for n, _ in _orphans(data).values()))


def test_a_round_completing_after_the_liveness_is_read_keeps_its_rows(tmp_path):
    """The collection reads the liveness before it takes the scorer's lock; a real round that completes in
    between is no orphan: the stored rounds are read under the lock."""
    data = tmp_path / "data"
    sb = StoreBuilder(data)
    sb.spans(agent_turn("t0", "conv-1", 1_000_000, "search"))
    build_store(data, idle_seconds=0, gc=NO_GC)
    score_store(data)
    sb.spans(agent_turn("t1", "conv-1", 2_000_000, "search") + agent_turn("u0", "conv-2", 3_000_000, "fetch"))
    build_store(data, idle_seconds=0, gc=NO_GC)

    lv = liveness(data)  # what collect reads first, before the lock
    done = _tracedag(data, tmp_path, "score", "--no-progress")  # a whole round completes meanwhile
    assert done.returncode == 0, done.stderr
    kept, answers = _newest_rows(data), _answers(data)
    assert len(kept["materialized_failures"]) == 3

    stats = GcStats()
    collect_scored(data, lv, GcSettings(), True, stats)  # what collect does next, under the lock

    assert not stats.orphan_rows and not stats.skipped
    assert _newest_rows(data) == kept
    assert materialized_answers(data) == answers  # the stored rows answer, as the SQL does, what they did before


def test_collections_racing_scorer_processes_never_drop_a_completed_round(tmp_path):
    """Builds (each followed by a compacting collection) in this process while real ``tracedag score`` processes
    store rounds beside them: every round that completed keeps its rows, whenever the collections ran."""
    data = tmp_path / "data"
    sb = StoreBuilder(data)
    sb.spans(agent_turn("t0", "conv-0", 1_000_000, "search"))
    build_store(data, idle_seconds=0, gc=NO_GC)
    stop = threading.Event()
    codes: list[int] = []
    errors: list[str] = []

    def scorers() -> None:
        while not stop.is_set():
            done = _tracedag(data, tmp_path, "score", "--no-progress")
            codes.append(done.returncode)
            if done.returncode:
                errors.append(done.stderr)

    thread = threading.Thread(target=scorers)
    thread.start()
    try:
        for i in range(1, 5):
            sb.spans(agent_turn(f"t{i}", f"conv-{i % 2}", 1_000_000 * (i + 1), "search"))
            build_store(data, idle_seconds=0, compact=True)
    finally:
        stop.set()
        thread.join()
    assert codes and set(codes) == {0}, errors
    score_store(data)  # what the last builds left pending
    build_store(data, idle_seconds=0, compact=True)
    assert _orphans(data) == {t: (0, 0) for t in RESULTS}
    assert len(_newest_rows(data)["materialized_failures"]) == 5  # one failing tool a turn, every turn stored
    assert_materialized_equal(data)
