"""A repeat of a step key is a retry only when it redoes the operation that failed (issue #30 class 1).

``loops.iterations`` on hand-made rows (one trace, worked out by hand): rows 0..3 share one step key
(digits dropped from the span names ``Step 1``, ``Step 2``, ``Step 3``, ``Step 3``), in four stages.
``Step 1`` fails. Without operations, ``Step 2`` counted as its retry; with the operation of each
row (the name with its number: 0 = ``Step 1``, 1 = ``Step 2``, 2 = ``Step 3``) it is the loop going
on. A tool row (key 1, the same operation each time) failing then passing is still a retry.
"""

from __future__ import annotations

import numpy as np

from tracedag.pipeline.dag.loops import iterations

TRACE = np.zeros(6, dtype=np.int64)
KEY = np.array([0, 0, 0, 0, 1, 1], dtype=np.int64)
PRANK = np.array([0, 1, 2, 3, 0, 1], dtype=np.int64)
OP = np.array([0, 1, 2, 2, 3, 3], dtype=np.int64)


def test_without_operations_the_next_iteration_after_a_failure_is_a_retry() -> None:
    failed = np.array([True, False, True, False, True, False])
    it, retry = iterations(TRACE, KEY, PRANK, failed)
    assert it.tolist() == [1, 2, 3, 4, 1, 2]
    assert retry.tolist() == [False, True, False, True, False, True]


def test_with_operations_only_the_same_operation_redone_is_a_retry() -> None:
    failed = np.array([True, False, True, False, True, False])
    it, retry = iterations(TRACE, KEY, PRANK, failed, OP)
    assert it.tolist() == [1, 2, 3, 4, 1, 2]
    # Step 2 is not Step 1 redone; the second Step 3 redoes the failed Step 3; the tool is redone
    assert retry.tolist() == [False, False, False, True, False, True]


def test_a_parallel_stage_redoes_the_operation_that_failed_in_it() -> None:
    # two instances of one key in stage 0 (ops 0 and 1; op 1 fails), both again in stage 1
    trace = np.zeros(4, dtype=np.int64)
    key = np.zeros(4, dtype=np.int64)
    prank = np.array([0, 0, 1, 1], dtype=np.int64)
    op = np.array([0, 1, 0, 1], dtype=np.int64)
    failed = np.array([False, True, False, False])
    it, retry = iterations(trace, key, prank, failed, op)
    assert it.tolist() == [1, 1, 2, 2]
    assert retry.tolist() == [False, False, False, True]
