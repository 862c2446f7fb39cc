-- amplification: per failure category, downstream failures caused per originating failure and the share propagated.
--
-- Inputs:  traces, dag_nodes, dag_edges (upstream_span_id -> downstream_span_id), step_scores
-- Output:  category, failures, originating, propagated, recovered, propagated_share,
--          downstream_failures, amplification_factor
-- Params:
--   $fail_threshold  double  = 2.0   a step fails when its aggregated score is <= this (scale 1..5)
--   $since_ns        bigint  = 0     only traces that started at or after this time (ns since epoch)
--   $trace_id        varchar = ''    only this trace ('' = every trace)
--   $level           integer = 1     taxonomy level of the category: 1, 2 or 3
--   $max_hops        integer = 1000  bound on the failure-chain recursion
--
-- Scores, recovered retries, the failure DAG and originating/propagated are defined in
-- propagation.sql. A failure's category is the taxonomy label (at $level) of its lowest-scoring
-- score row; 'unclassified' when it has none. Per category:
--   failures             failed steps of the category (recovered ones included)
--   originating          non-recovered originating failures (recovered ones cause nothing)
--   propagated           failures with a failing step upstream; propagated_share = propagated / failures
--   recovered            failures a later retry of the same step fixed
--   downstream_failures  sum over the originating failures of the failures downstream of each in
--                        the failure DAG (a failure downstream of two originating ones counts for both)
--   amplification_factor downstream_failures / originating (null when no originating failure)
-- Recursion bounds: the downstream walk (reach) is a UNION over a finite set of (failure, step)
-- pairs, so it ends even on a cyclic edge set; the failure-DAG closure and the greedy walk stop
-- after $max_hops hops.
with recursive
win as (
    select trace_id
    from traces
    where coalesce(start_time_unix_nano, 0) >= cast($since_ns as bigint)
      and (cast($trace_id as varchar) = '' or trace_id = cast($trace_id as varchar))
),
step_score as (
    -- every step with a failing score row or a human row: the human row if there is one, else the
    -- lowest score (ties: a row with a taxonomy first, then by metric, source). A step without such
    -- a row cannot fail, so the other rows are never read past the filter.
    select trace_id, span_id, unnest(best)
    from (
        select trace_id, span_id,
               arg_min({'score': cast(score as double), 'metric': metric, 'source': source,
                        'taxonomy_l1': taxonomy_l1, 'taxonomy_l2': taxonomy_l2,
                        'taxonomy_l3': taxonomy_l3},
                       (coalesce(source, '') <> 'human', cast(score as double), taxonomy_l1 is null,
                        metric, source)) as best
        from step_scores
        where score is not null
          and (cast(score as double) <= cast($fail_threshold as double) or source = 'human')
          and trace_id in (select trace_id from win)
        group by trace_id, span_id
    )
),
failed_step as (
    select * from step_score where score <= cast($fail_threshold as double)
),
tnode as materialized (
    -- the steps of the traces that have a failure
    select trace_id, span_id, cast(step_type as varchar) as step_type, step_name,
           coalesce(step_key, step_name, span_id) as step_key, coalesce(iteration, 1) as iteration,
           start_time_unix_nano, end_time_unix_nano, duration_ns
    from dag_nodes
    where trace_id in (select trace_id from failed_step)
),
fail_node as (
    select n.*, s.score, s.metric, s.source, s.taxonomy_l1, s.taxonomy_l2, s.taxonomy_l3
    from failed_step s
    join tnode n on n.trace_id = s.trace_id and n.span_id = s.span_id
),
last_ok as (
    -- per step key that has a failure: the last iteration that did not fail
    select n.trace_id, n.step_key, max(n.iteration) as iteration
    from tnode n
    semi join fail_node k on k.trace_id = n.trace_id and k.step_key = n.step_key
    anti join fail_node g on g.trace_id = n.trace_id and g.span_id = n.span_id
    group by n.trace_id, n.step_key
),
fail as (
    -- recovered: a later iteration of the same step key did not fail
    select f.*, coalesce(l.iteration > f.iteration, false) as recovered
    from fail_node f
    left join last_ok l on l.trace_id = f.trace_id and l.step_key = f.step_key
),
src as (
    select trace_id, span_id from fail where not recovered
),
dep as (
    select e.trace_id, e.upstream_span_id as up, e.downstream_span_id as down,
           s.span_id is not null as down_is_src
    from dag_edges e
    left join src s on s.trace_id = e.trace_id and s.span_id = e.downstream_span_id
    where e.upstream_span_id is not null and e.downstream_span_id is not null
      and e.trace_id in (select trace_id from src)
),
-- walk downstream from every non-recovered failure, stopping at the next non-recovered failure
reach(trace_id, src_id, node_id, stop) as (
    select d.trace_id, d.up, d.down, d.down_is_src
    from dep d join src s on s.trace_id = d.trace_id and s.span_id = d.up
    union
    select r.trace_id, r.src_id, d.down, d.down_is_src
    from reach r join dep d on d.trace_id = r.trace_id and d.up = r.node_id
    where not r.stop
),
fe as (
    select distinct r.trace_id, r.src_id as up, r.node_id as down
    from reach r join fail f on f.trace_id = r.trace_id and f.span_id = r.node_id
    where r.src_id <> r.node_id
),
-- transitive failing upstream; dist = hops of the longest failure-DAG path (USING KEY keeps the last)
anc(trace_id, v, a, dist) using key (trace_id, v, a) as (
    select trace_id, down, up, 1 from fe
    union
    select anc.trace_id, anc.v, fe.up, anc.dist + 1
    from anc join fe on fe.trace_id = anc.trace_id and fe.down = anc.a
    where anc.dist < cast($max_hops as integer)
),
blast as (
    select trace_id, a as span_id, count(*) as downstream_failures
    from anc group by all
),
classified as (
    select f.*,
           coalesce(case cast($level as integer) when 1 then f.taxonomy_l1 when 2 then f.taxonomy_l2
                    else f.taxonomy_l3 end, 'unclassified') as category,
           exists (select 1 from fe where fe.trace_id = f.trace_id and fe.down = f.span_id) as propagated,
           coalesce(b.downstream_failures, 0) as downstream_failures
    from fail f
    left join blast b on b.trace_id = f.trace_id and b.span_id = f.span_id
)
select category,
       count(*) as failures,
       count(*) filter (where not propagated and not recovered) as originating,
       count(*) filter (where propagated) as propagated,
       count(*) filter (where recovered) as recovered,
       cast(count(*) filter (where propagated) as double) / count(*) as propagated_share,
       coalesce(sum(downstream_failures) filter (where not propagated and not recovered), 0)
           as downstream_failures,
       cast(sum(downstream_failures) filter (where not propagated and not recovered) as double)
           / nullif(count(*) filter (where not propagated and not recovered), 0) as amplification_factor
from classified
group by category
order by downstream_failures desc, failures desc, category
