"""The collection tells live rows from dead ones by hashes of the live pairs made once (``Liveness.holds``).

It asked ``pc.is_in`` against every live (trace, build) pair of the store for each file it rewrote or merged, which
hashed them all again each time (0.19 s CPU a file on 870k traces, ``bench/gc_live.py``). The hashes are made once;
a live pair is always held, a dead one is not (but for a 64-bit collision, which only keeps a dead row).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracedag.pipeline.store.gc import Liveness, latest_builds, live_mask
from tracedag.pipeline.store.hashes import sorted_unique


def _liveness() -> Liveness:
    pairs = pa.table({"trace_id": ["t1", "t1", "t2", "t3", "t3"],
                      "build_id": ["b1", "b2", "b1", "b3", "b1"],
                      "built_unix_nano": pa.array([1, 2, 1, 5, 9], pa.int64()),
                      "span_count": pa.array([3, 4, 2, 1, 1], pa.int64())})
    keys, per_build = latest_builds(pairs)
    return Liveness(keys=keys, total=per_build["total"], live=per_build["live"], dead_spans=per_build["dead_spans"])


def test_each_traces_latest_build_is_held_and_its_older_builds_are_not() -> None:
    lv = _liveness()
    asked = pa.array(["t1\x1fb1", "t1\x1fb2", "t2\x1fb1", "t3\x1fb3", "t3\x1fb1", "t4\x1fb1", "t2\x1fb2"])
    assert lv.holds(asked).tolist() == [False, True, True, False, True, False, False]
    assert lv.holds(asked).tolist() == pc.is_in(asked, value_set=lv.keys).to_pylist()  # the exact answer
    assert lv.holds(pa.array([], pa.string())).tolist() == []


def test_the_rows_kept_are_the_live_ones_and_rows_without_a_build_stay() -> None:
    lv = _liveness()
    rows = pa.table({"trace_id": ["t1", "t1", "t2", "t3", "t5"], "build_id": ["b1", "b2", None, "b3", "b1"]})
    assert live_mask(rows, lv).to_pylist() == [False, True, True, False, False]


def test_a_liveness_made_again_with_the_stored_rounds_answers_alike() -> None:
    lv = _liveness()
    again = replace(lv, stored_rounds=frozenset({7}), stored_array=pa.array([7], pa.int64()))
    asked = pa.array(["t1\x1fb2", "t1\x1fb1"])
    assert again.holds(asked).tolist() == lv.holds(asked).tolist() == [True, False]
    assert np.array_equal(again.key_hashes, lv.key_hashes) and len(lv.key_hashes) == 3


def test_a_store_without_a_live_pair_holds_nothing() -> None:
    lv = Liveness(keys=pa.array([], pa.string()), total={}, live={})
    assert lv.holds(pa.array(["t1\x1fb1"])).tolist() == [False]


def test_the_distinct_hashes_are_numpys_unique_of_them() -> None:
    """``hashes.sorted_unique`` (a radix sort and one pass, which every hash index of the store uses) gives what
    ``np.unique`` gives: empty, one value, all equal, the extremes of 64 bits, many repeated."""
    rng = np.random.default_rng(7)
    cases = [np.zeros(0, np.uint64), np.array([5], np.uint64), np.full(9, 3, np.uint64),
             np.array([2**64 - 1, 0, 2**63, 2**64 - 1, 0], np.uint64),
             rng.integers(0, 2**63, 50_000, dtype=np.int64).astype(np.uint64).repeat(3)]
    for values in cases:
        got = sorted_unique(values)
        assert got.dtype == values.dtype and np.array_equal(got, np.unique(values))
