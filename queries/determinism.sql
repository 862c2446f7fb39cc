-- determinism: trajectory consistency and coverage per agent and scenario, over the exact replays
-- and over the variants measured against the base (modal) path of the replays.
-- Inputs: relation run_paths (tracedag.pipeline.analysis.trajectories.runs_table), one row per run:
--   agent, agent_version, scenario, variant_id (null = exact replay), run_key,
--   node_path, action_path, action_input_path (varchar[]).
--   (tracedag determinism writes both to <data>/tables/run_paths/ and <data>/tables/node_visits/,
--   so `tracedag query NAME` runs this again over the store.)
-- Definitions (per agent, agent_version, scenario; kind = node | action | action_input):
--   modal path   the most frequent path of the exact replays; ties go to the shorter path, then the
--                smaller path in list order (so the choice does not depend on run order).
--   consistency  replays: share of replays whose path equals the modal path;
--                variants: share of variant runs whose path equals the base (modal) path.
--   coverage     replays: mean pairwise Jaccard of the runs' sets (two empty sets -> 1; a single
--                run has no pair -> 1.0); variants: mean Jaccard of each variant run's set with the
--                base path's set.
--   Variants of a scenario without exact replays get null metrics and reason 'no exact replays (no base path)'.
--   Response consistency (judge or offline) is added by `tracedag determinism` in Python: the
--   stored table <data>/tables/determinism/ has it, this query's own output does not.
-- Params: none.
-- Output columns: agent, agent_version, scenario, comparison ('replays' | 'variants'), runs,
--   variants (distinct variant ids), node_consistency, node_coverage, action_consistency,
--   action_coverage, action_input_consistency, action_input_coverage, base_node_path,
--   base_action_path, base_action_input_path, reason.
with r as (
    select dense_rank() over (order by agent, agent_version nulls first, scenario) as gid,
           agent, agent_version, scenario, variant_id, coalesce(variant_id, '') = '' as is_base, run_key,
           node_path, action_path, action_input_path
    from run_paths
),
groups as (
    select gid, any_value(agent) as agent, any_value(agent_version) as agent_version,
           any_value(scenario) as scenario
    from r group by gid
),
paths as (
    select gid, is_base, variant_id, run_key, 'node' as kind, node_path as path from r
    union all
    select gid, is_base, variant_id, run_key, 'action', action_path from r
    union all
    select gid, is_base, variant_id, run_key, 'action_input', action_input_path from r
),
sets as (
    select *, list_sort(list_distinct(path)) as pset from paths
),
ranked as (
    select gid, kind, path, count(*) as n,
           row_number() over (partition by gid, kind order by count(*) desc, len(path), path) as rk
    from sets where is_base
    group by gid, kind, path
),
base as (
    select gid, kind, path, list_sort(list_distinct(path)) as bset from ranked where rk = 1
),
set_counts as (  -- runs with equal sets are counted once, so the pairs cost grows with distinct sets
    select gid, kind, pset, count(*)::double as n from sets where is_base group by gid, kind, pset
),
pair_sums as (
    -- pairs of runs with the same set have Jaccard 1
    select gid, kind, n * (n - 1) / 2 as pairs, n * (n - 1) / 2 as jsum from set_counts
    union all
    select a.gid, a.kind, a.n * b.n,
           a.n * b.n * case when len(list_distinct(list_concat(a.pset, b.pset))) = 0 then 1.0
                            else len(list_intersect(a.pset, b.pset))::double
                                 / len(list_distinct(list_concat(a.pset, b.pset))) end
    from set_counts a join set_counts b on a.gid = b.gid and a.kind = b.kind and a.pset < b.pset
),
pair_cov as (
    select gid, kind, sum(jsum) / nullif(sum(pairs), 0) as coverage from pair_sums group by gid, kind
),
replay_metrics as (
    select s.gid, s.kind, 'replays' as comparison, count(*) as runs, 0 as variants,
           avg(case when s.path = b.path then 1.0 else 0.0 end) as consistency,
           coalesce(any_value(c.coverage), 1.0) as coverage,
           any_value(b.path) as base_path, null::varchar as reason
    from sets s join base b on b.gid = s.gid and b.kind = s.kind
    left join pair_cov c on c.gid = s.gid and c.kind = s.kind
    where s.is_base
    group by s.gid, s.kind
),
variant_metrics as (
    select s.gid, s.kind, 'variants' as comparison, count(*) as runs,
           count(distinct s.variant_id) as variants,
           case when count(b.gid) = 0 then null
                else avg(case when s.path = b.path then 1.0 else 0.0 end) end as consistency,
           case when count(b.gid) = 0 then null
                else avg(case when len(list_distinct(list_concat(s.pset, b.bset))) = 0 then 1.0
                              else len(list_intersect(s.pset, b.bset))::double
                                   / len(list_distinct(list_concat(s.pset, b.bset))) end) end as coverage,
           any_value(b.path) as base_path,
           case when count(b.gid) = 0 then 'no exact replays (no base path)' end as reason
    from sets s left join base b on b.gid = s.gid and b.kind = s.kind
    where not s.is_base
    group by s.gid, s.kind
),
metrics as (
    select * from replay_metrics
    union all
    select * from variant_metrics
)
select g.agent, g.agent_version, g.scenario, m.comparison,
       max(m.runs) as runs, max(m.variants) as variants,
       max(m.consistency) filter (where m.kind = 'node') as node_consistency,
       max(m.coverage) filter (where m.kind = 'node') as node_coverage,
       max(m.consistency) filter (where m.kind = 'action') as action_consistency,
       max(m.coverage) filter (where m.kind = 'action') as action_coverage,
       max(m.consistency) filter (where m.kind = 'action_input') as action_input_consistency,
       max(m.coverage) filter (where m.kind = 'action_input') as action_input_coverage,
       max(m.base_path) filter (where m.kind = 'node') as base_node_path,
       max(m.base_path) filter (where m.kind = 'action') as base_action_path,
       max(m.base_path) filter (where m.kind = 'action_input') as base_action_input_path,
       max(m.reason) as reason
from metrics m join groups g on g.gid = m.gid
group by g.agent, g.agent_version, g.scenario, m.comparison
order by g.agent, g.agent_version nulls first, g.scenario, m.comparison
