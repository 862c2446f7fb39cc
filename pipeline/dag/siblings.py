"""Happened-before among siblings (same call-tree parent), vectorized in DuckDB.

Two orders, chosen per sibling group:

- **step order** (explicit): every sibling carries a LangGraph super-step (``langgraph_step``) that it
  did not just inherit from its parent; B follows A when A's step is smaller. Edges join each step to
  the next step present (all-to-all: a super-step is a barrier).
- **time order** (inferred): B follows A when ``A.start < B.start`` and ``A.end <= B.start + tolerance``.
  Equal starts are concurrent (no order can be read from them). The edges kept are the transitive
  reduction: A -> B is implied by some C exactly when ``max{C.start : C precedes B} + tolerance >= A.end``
  and A is not that C, so only the predecessors of B with ``A.end > maxstart + tol`` (or ``A.start =
  maxstart``) are kept.

Each row also gets ``n_pred``/``n_succ`` (siblings ordered before/after it): a row with
``n_pred + n_succ < group size - 1`` ran concurrently with a sibling, i.e. on a parallel branch, and
``n_pred`` is its stage: concurrent instances of a step share it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import duckdb
import numpy as np
import pyarrow as pa

from tracedag.pipeline.dag.tree import BoolArray, IntArray
from tracedag.pipeline.store import fetch

logger = logging.getLogger(__name__)

DEFAULT_TOLERANCE_NS = 1_000_000  # 1 ms: B follows A if it started no earlier than 1 ms before A ended

_GROUPS = """
create or replace temp table sib_groups as
select grp, count(*) as gsize,
       count(*) = count(step)
       and bool_or(pstep is null or step <> pstep or node is distinct from pnode) as step_mode
from sib group by grp
"""

_TIME_PAIRS = """
create or replace temp table sib_pairs as
with t as (select s.* from sib s join sib_groups g using (grp) where not g.step_mode)
select a.idx as a, b.idx as b, a.s as a_s, a.e as a_e
from t a join t b on a.grp = b.grp and a.s < b.s and a.e <= b.s + $tol
"""

_TIME_EDGES = """
select p.a, p.b from sib_pairs p
join (select b, max(a_s) as ms from sib_pairs group by b) m using (b)
where p.a_s = m.ms or p.a_e > m.ms + $tol
"""

_STEP_RANKS = """
create or replace temp table sib_steps as
select s.idx, s.grp,
       dense_rank() over (partition by s.grp order by s.step) as r,
       rank() over (partition by s.grp order by s.step) - 1 as n_pred,
       rank() over (partition by s.grp order by s.step desc) - 1 as n_succ
from sib s join sib_groups g using (grp) where g.step_mode
"""

_STEP_EDGES = "select a.idx as a, b.idx as b from sib_steps a join sib_steps b on a.grp = b.grp and b.r = a.r + 1"

_PAIR_COUNTS = """
select a as idx, count(*) as n, true as is_pred_of_other from sib_pairs group by a
union all
select b, count(*), false from sib_pairs group by b
"""

@dataclass(frozen=True)
class SiblingOrder:
    """Reduced sibling edges (``src -> dst`` rows) and per-row order counts."""

    src: IntArray
    dst: IntArray
    n_pred: IntArray
    n_succ: IntArray
    group_size: IntArray
    step_mode: BoolArray

    @property
    def concurrent(self) -> BoolArray:
        """Rows that ran concurrently with at least one sibling."""
        return (self.n_pred + self.n_succ) < (self.group_size - 1)


def sibling_order(con: duckdb.DuckDBPyConnection, sib: pa.Table, tolerance_ns: int) -> SiblingOrder:
    """Order the siblings in ``sib`` (columns idx, grp, s, e, step, node, pstep, pnode; idx = 0..n-1)."""
    con.register("sib", sib)
    try:
        con.execute(_GROUPS)
        con.execute(_TIME_PAIRS, {"tol": tolerance_ns})
        con.execute(_STEP_RANKS)
        t_edges = arrow(con, _TIME_EDGES, {"tol": tolerance_ns})
        s_edges = arrow(con, _STEP_EDGES)
        groups = arrow(con, "select grp, gsize, step_mode from sib_groups")
        steps = arrow(con, "select idx, n_pred, n_succ from sib_steps")
        pairs = arrow(con, _PAIR_COUNTS)
    finally:
        con.unregister("sib")
        for t in ("sib_groups", "sib_pairs", "sib_steps"):
            con.execute(f"drop table if exists {t}")
    n = sib.num_rows
    grp = _col(sib, "grp")
    size_of = np.zeros(int(grp.max()) + 1 if n else 1, dtype=np.int64)
    size_of[_col(groups, "grp")] = _col(groups, "gsize")
    mode_of = np.zeros(size_of.size, dtype=np.bool_)
    mode_of[_col(groups, "grp")] = groups.column("step_mode").to_numpy(zero_copy_only=False).astype(np.bool_)
    n_pred = np.zeros(n, dtype=np.int64)
    n_succ = np.zeros(n, dtype=np.int64)
    is_a = pairs.column("is_pred_of_other").to_numpy(zero_copy_only=False).astype(np.bool_)
    idx, cnt = _col(pairs, "idx"), _col(pairs, "n")
    n_succ[idx[is_a]] = cnt[is_a]
    n_pred[idx[~is_a]] = cnt[~is_a]
    n_pred[_col(steps, "idx")] = _col(steps, "n_pred")
    n_succ[_col(steps, "idx")] = _col(steps, "n_succ")
    return SiblingOrder(
        src=np.concatenate([_col(t_edges, "a"), _col(s_edges, "a")]),
        dst=np.concatenate([_col(t_edges, "b"), _col(s_edges, "b")]),
        n_pred=n_pred,
        n_succ=n_succ,
        group_size=size_of[grp],
        step_mode=mode_of[grp],
    )


def arrow(con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, object] | None = None) -> pa.Table:
    """Run ``sql`` with bound ``$name`` parameters and return the rows as an Arrow table, planned once
    (``store.fetch.arrow``: a relation's fetch binds the query a second time; the reconstruction's results are
    row numbers and counts, whose extra copy costs less: a 10k-span round's build 204 -> 187 ms CPU)."""
    return fetch.arrow(con, sql, params)


def _col(t: pa.Table, name: str) -> IntArray:
    return np.asarray(t.column(name).to_numpy(zero_copy_only=False), dtype=np.int64)
