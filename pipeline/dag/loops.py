"""Loop unrolling and parallel branches, on numpy arrays (see tree.py for the row conventions)."""

from __future__ import annotations

import logging

import numpy as np

from tracedag.pipeline.dag.tree import BoolArray, IntArray, resolve_pointers

logger = logging.getLogger(__name__)


def step_keys(
    parent: IntArray, by_depth: list[IntArray], local: IntArray, local_names: list[str]
) -> tuple[IntArray, list[str]]:
    """Logical step of each row: the ``/``-joined step names from its root; returns key ids and key texts."""
    key = np.zeros(parent.size, dtype=np.int64)
    texts: list[str] = []
    width = max(len(local_names), 1)
    for d, rows in enumerate(by_depth):
        comb = local[rows] if d == 0 else key[parent[rows]] * width + local[rows]
        uniq, inverse = np.unique(comb, return_inverse=True)
        base = len(texts)
        key[rows] = base + inverse.reshape(-1)
        for u in uniq.tolist():
            name = local_names[u % width]
            texts.append(name if d == 0 else f"{texts[u // width]}/{name}")
    return key, texts


def path_ranks(parent: IntArray, by_depth: list[IntArray], stage: IntArray) -> IntArray:
    """Rank of each row by the stages of its ancestors and itself (lexicographic, one depth at a time)."""
    rank = np.zeros(parent.size, dtype=np.int64)
    width = int(stage.max()) + 1 if stage.size else 1
    for d, rows in enumerate(by_depth):
        comb = stage[rows] if d == 0 else rank[parent[rows]] * width + stage[rows]
        _, inverse = np.unique(comb, return_inverse=True)
        rank[rows] = inverse.reshape(-1)
    return rank


def iterations(
    trace: IntArray, key: IntArray, prank: IntArray, failed: BoolArray, op: IntArray | None = None
) -> tuple[IntArray, BoolArray]:
    """Iteration 1..k of each row among rows of the same step key, and whether it retries the previous one.

    Rows of one key with equal path rank (parallel instances in one stage) share an iteration. A row
    is a retry when a row of the previous iteration failed and, given ``op`` (the operation of each
    row: its span name with the numbers step keys drop), ran the same operation: smolagents'
    ``Step 2`` after a failed ``Step 1`` is the loop going on, not a retry.
    """
    order = np.lexsort((prank, key, trace))
    t, k, r = trace[order], key[order], prank[order]
    new_group = np.ones(order.size, dtype=np.bool_)
    new_group[1:] = (t[1:] != t[:-1]) | (k[1:] != k[:-1])
    new_iter = new_group.copy()
    new_iter[1:] |= r[1:] != r[:-1]
    block = np.cumsum(new_iter) - 1  # one block per (trace, key, iteration)
    group_first_block = np.maximum.accumulate(np.where(new_group, block, 0))
    it_sorted = block - group_first_block + 1
    block_failed = np.zeros(int(block[-1]) + 1 if block.size else 0, dtype=np.bool_)
    np.logical_or.at(block_failed, block, failed[order])
    prev_failed = np.zeros(order.size, dtype=np.bool_)
    has_prev = it_sorted > 1
    prev_failed[has_prev] = block_failed[block[has_prev] - 1]
    if op is not None:
        prev_failed &= _same_failed_op(block, failed[order], op[order], has_prev)
    iteration = np.empty(order.size, dtype=np.int64)
    retry = np.empty(order.size, dtype=np.bool_)
    iteration[order] = it_sorted
    retry[order] = prev_failed
    return iteration, retry


def _same_failed_op(block: IntArray, failed: BoolArray, op: IntArray, has_prev: BoolArray) -> BoolArray:
    """Whether each row (sorted by block) has the operation of a failed row of the previous block."""
    width = int(op.max()) + 1 if op.size else 1
    failed_keys = block[failed] * width + op[failed]
    return has_prev & np.isin((block - 1) * width + op, failed_keys)


def branches(
    parent: IntArray,
    by_depth: list[IntArray],
    trace: IntArray,
    left: IntArray,
    concurrent: BoolArray,
    edge_src: IntArray,
    edge_dst: IntArray,
) -> IntArray:
    """Branch id of each row: 0 on the main line, else a per-trace id (1..) of its parallel branch.

    A concurrent row continues the branch of its only predecessor when that predecessor is
    concurrent and has no other successor (a chain inside a branch); other concurrent rows start a
    branch. Rows that ran alone among their siblings inherit their parent's branch.
    """
    n = parent.size
    in_deg = np.bincount(edge_dst, minlength=n)
    out_deg = np.bincount(edge_src, minlength=n)
    pred = np.full(n, -1, dtype=np.int64)
    single = in_deg[edge_dst] == 1
    pred[edge_dst[single]] = edge_src[single]
    cont = concurrent & (pred >= 0)
    cont[cont] &= (out_deg[pred[cont]] == 1) & concurrent[pred[cont]]
    head = concurrent & ~cont
    ptr = np.where(cont, pred, np.arange(n, dtype=np.int64))
    root = resolve_pointers(ptr)
    head_rows = np.flatnonzero(head)
    order = head_rows[np.lexsort((left[head_rows], trace[head_rows]))]
    head_id = np.zeros(n, dtype=np.int64)
    if order.size:
        t = trace[order]
        first = np.ones(t.size, dtype=np.bool_)
        first[1:] = t[1:] != t[:-1]
        base = np.maximum.accumulate(np.where(first, np.arange(t.size), 0))
        head_id[order] = np.arange(t.size) - base + 1
    branch = np.where(concurrent, head_id[root], 0)
    for rows in by_depth[1:]:
        main = rows[~concurrent[rows]]
        branch[main] = branch[parent[main]]
    return branch
