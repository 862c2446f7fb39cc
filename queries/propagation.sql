-- propagation: for each failed step, originating or propagated, its failing upstream steps and its chain length.
--
-- Inputs:  traces, dag_nodes, dag_edges (upstream_span_id -> downstream_span_id), step_scores,
--          read through the macro failure_graph of _failure_graph.sql
-- Output:  trace_id, span_id, step_type, step_name, iteration, score, taxonomy_l1, taxonomy_l2,
--          taxonomy_l3, recovered, kind ('originating' | 'propagated'), nearest_failing_upstream
--          (span ids, by start), failing_upstream (span ids, by start), chain_length, start_time,
--          start_time_unix_nano
-- Params:
--   $fail_threshold  double  = 2.0  a step fails when its aggregated score is <= this (scale 1..5)
--   $since_ns        bigint  = 0    only traces that started at or after this time (ns since epoch)
--   $trace_id        varchar = ''   only this trace ('' = every trace)
--   $max_hops        integer = 1000 bound on the failure-chain recursion
--
-- Step score and category as in failures.sql (minimum over metrics, human labels override).
-- Dependency direction (dag_edges): an earlier sibling influences a later one, a child its parent.
-- A failure is *recovered* when a later iteration of the same step_key did not fail; a recovered
-- failure is never a cause: propagation does not start from it (it may itself be propagated, and
-- paths pass through it).
-- Failure DAG: an edge u -> v when u is a non-recovered failure, v a failure, and v is reachable
-- from u along dependency edges whose intermediate steps are not non-recovered failures.
-- nearest_failing_upstream = the u of those edges; failing_upstream = every failure that reaches v
-- in the failure DAG (transitively). kind = 'propagated' when failing_upstream is not empty.
-- chain_length = hops of the longest failure-DAG path from an originating failure to the step
-- (0 for an originating failure).
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
nearest as (
    select fe.trace_id, fe.down as span_id,
           list(fe.up order by u.start_time_unix_nano, fe.up) as nearest_failing_upstream
    from fe join fail u on u.trace_id = fe.trace_id and u.span_id = fe.up
    group by all
),
upstream as (
    select anc.trace_id, anc.v as span_id,
           list(anc.a order by u.start_time_unix_nano, anc.a) as failing_upstream,
           max(anc.dist) as chain_length
    from anc join fail u on u.trace_id = anc.trace_id and u.span_id = anc.a
    group by all
)
select f.trace_id, f.span_id, f.step_type, f.step_name, f.iteration, f.score,
       f.taxonomy_l1, f.taxonomy_l2, f.taxonomy_l3, f.recovered,
       case when u.span_id is null then 'originating' else 'propagated' end as kind,
       coalesce(n.nearest_failing_upstream, []::varchar[]) as nearest_failing_upstream,
       coalesce(u.failing_upstream, []::varchar[]) as failing_upstream,
       coalesce(u.chain_length, 0) as chain_length,
       make_timestamp(f.start_time_unix_nano // 1000) as start_time, f.start_time_unix_nano
from fail f
left join nearest n on n.trace_id = f.trace_id and n.span_id = f.span_id
left join upstream u on u.trace_id = f.trace_id and u.span_id = f.span_id
order by f.trace_id, f.start_time_unix_nano, f.span_id
