-- amplification: per failure category, downstream failures caused per originating failure and the share propagated.
--
-- Inputs:  traces, dag_nodes, dag_edges (upstream_span_id -> downstream_span_id), step_scores,
--          spans, read through the macro failure_graph of _failure_graph.sql
-- Output:  category, failures, originating, propagated, recovered, propagated_share,
--          downstream_failures, amplification_factor
-- Params:
--   $fail_threshold  double  = 2.0   a step fails when its score (the minimum over its step_scores rows) is <= this (scale 1..5)
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
with
g as materialized (
    from failure_graph($fail_threshold, (select list(trace_id) from trace_window($since_ns, $trace_id)),
                        $max_hops)
),
fail as (
    select * exclude (nearest, ancestors) from g
),
fe as (
    -- the failure DAG: an edge up -> down
    select trace_id, unnest(nearest) as up, span_id as down from g
),
anc as (
    -- its closure: a fails upstream of v, dist = hops of the longest path from a to v
    select trace_id, span_id as v, unnest(ancestors, recursive := true) from g
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
