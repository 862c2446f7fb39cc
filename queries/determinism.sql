-- determinism: trajectory consistency and coverage per agent and scenario, over the exact replays
-- and over the variants measured against the base (modal) path of the replays.
-- columns: agent, scenario, comparison, runs, node_consistency, node_coverage, action_consistency, action_coverage, reason
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
--                Replay coverage is exact while the distinct sets form at most pair_sample (40,000)
--                pairs (at most 283 distinct sets); above that it is the mean Jaccard of pair_sample
--                pairs of distinct replays drawn uniformly with replacement by a seeded hash of the
--                group's labels and the draw number: unbiased, the same on every run (same DuckDB
--                version), and within +-0.0097 of the exact mean with 99.9% confidence (Hoeffding:
--                P(|error| >= e) <= 2 exp(-2 pair_sample e^2)). The cost is linear in the runs.
--                coverage_estimated lists the kinds whose coverage is such an estimate.
--                (tracedag.pipeline.analysis.pairs does the same in Python for response consistency.)
--   Variants of a scenario without exact replays get null metrics and reason 'no exact replays (no base path)'.
--   Response consistency (judge or offline) is added by `tracedag determinism` in Python: the
--   stored table <data>/tables/determinism/ has it, this query's own output does not.
-- Params: none.
-- Output columns: agent, agent_version, scenario, comparison ('replays' | 'variants'), runs,
--   variants (distinct variant ids), node_consistency, node_coverage, action_consistency,
--   action_coverage, action_input_consistency, action_input_coverage, base_node_path,
--   base_action_path, base_action_input_path, reason, coverage_estimated (varchar[]: 'node',
--   'action', 'action_input' for each coverage estimated from sampled pairs; [] when all are exact).
with knobs as (
    select 40000 as pair_sample, 'tracedag-pairs-v1' as seed  -- = pairs.PAIR_SAMPLE, pairs.SEED
),
r as (
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
set_sizes as (  -- distinct sets and replays per group and kind; sampled when the distinct pairs are too many
    select c.gid, c.kind, sum(c.n)::bigint as runs, count(*) * (count(*) - 1) / 2 > any_value(k.pair_sample) as sampled
    from set_counts c, knobs k group by c.gid, c.kind
),
exact_counts as materialized (  -- the groups computed exactly: at most pair_sample pairs of distinct sets
    select c.* from set_counts c join set_sizes z on z.gid = c.gid and z.kind = c.kind where not z.sampled
),
pair_sums as (
    -- pairs of runs with the same set have Jaccard 1
    select gid, kind, pset as aset, null::varchar[] as bset, n * (n - 1) / 2 as pairs, n * (n - 1) / 2 as jsum
    from exact_counts
    union all
    select a.gid, a.kind, a.pset, b.pset, a.n * b.n,
           a.n * b.n * case when len(list_distinct(list_concat(a.pset, b.pset))) = 0 then 1.0
                            else len(list_intersect(a.pset, b.pset))::double
                                 / len(list_distinct(list_concat(a.pset, b.pset))) end
    from exact_counts a join exact_counts b on a.gid = b.gid and a.kind = b.kind and a.pset < b.pset
),
numbered as materialized (  -- the replays of a sampled group, numbered 0.. in run_key order
    select s.gid, s.kind, s.pset, row_number() over (partition by s.gid, s.kind order by s.run_key) - 1 as idx
    from sets s join set_sizes z on z.gid = s.gid and z.kind = s.kind
    where s.is_base and z.sampled
),
draws0 as (  -- pair_sample draws (i, j') per sampled group, i uniform in [0, runs), j' in [0, runs - 1)
    select gid, kind, draw, (hash(seed, agent, agent_version, scenario, kind, draw, 'i') % runs)::bigint as i,
           (hash(seed, agent, agent_version, scenario, kind, draw, 'j') % (runs - 1))::bigint as j
    from (select z.gid, z.kind, z.runs, g.agent, g.agent_version, g.scenario, k.seed,
                 unnest(range(k.pair_sample)) as draw
          from set_sizes z join groups g on g.gid = z.gid cross join knobs k
          where z.sampled)
),
draws as (  -- pairs of distinct replays (j skips i), uniform over the group's pairs, seeded by the labels
    select gid, kind, draw, i, case when j >= i then j + 1 else j end as j from draws0
),
first_sets as materialized (  -- one join at a time: joined together, numbered would pair with itself
    select d.gid, d.kind, d.draw, d.j, a.pset as aset
    from draws d join numbered a on a.gid = d.gid and a.kind = d.kind and a.idx = d.i
),
sampled_pairs as (
    select f.gid, f.kind, f.draw,
           case when len(list_distinct(list_concat(f.aset, b.pset))) = 0 then 1.0
                else len(list_intersect(f.aset, b.pset))::double
                     / len(list_distinct(list_concat(f.aset, b.pset))) end as jsum
    from first_sets f join numbered b on b.gid = f.gid and b.kind = f.kind and b.idx = f.j
),
pair_cov as (  -- summed in a fixed order, so the figure does not depend on the order threads finish in
    select gid, kind, sum(jsum order by aset, bset nulls first) / nullif(sum(pairs), 0) as coverage
    from pair_sums group by gid, kind
    union all
    select gid, kind, sum(jsum order by draw) / count(*) from sampled_pairs group by gid, kind
),
replay_metrics as (
    select s.gid, s.kind, 'replays' as comparison, count(*) as runs, 0 as variants,
           avg(case when s.path = b.path then 1.0 else 0.0 end) as consistency,
           coalesce(any_value(c.coverage), 1.0) as coverage,
           any_value(b.path) as base_path, null::varchar as reason,
           coalesce(any_value(z.sampled), false) as estimated
    from sets s join base b on b.gid = s.gid and b.kind = s.kind
    left join pair_cov c on c.gid = s.gid and c.kind = s.kind
    left join set_sizes z on z.gid = s.gid and z.kind = s.kind
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
           case when count(b.gid) = 0 then 'no exact replays (no base path)' end as reason,
           false as estimated
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
       max(m.reason) as reason,
       list_sort(coalesce(list(m.kind) filter (where m.estimated), []::varchar[])) as coverage_estimated
from metrics m join groups g on g.gid = m.gid
group by g.agent, g.agent_version, g.scenario, m.comparison
order by g.agent, g.agent_version nulls first, g.scenario, m.comparison
