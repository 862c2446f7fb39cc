-- root_causes: root-cause step of each failed trace (or of each failed step) by a chosen strategy.
--
-- Inputs:  traces, dag_nodes, dag_edges (upstream_span_id -> downstream_span_id), step_scores,
--          read through the macros trace_window and failure_roots of _failure_graph.sql
-- Output:  trace_id, strategy, failed_span_id, failed_step_type, failed_step_name, failed_score,
--          recovered, kind, root_span_id, root_step_type, root_step_name, root_score,
--          root_taxonomy_l1, root_taxonomy_l2, root_taxonomy_l3, hops, failed_steps_in_trace,
--          conversation_id, start_time
-- Params:
--   $fail_threshold  double  = 2.0     a step fails when its aggregated score is <= this (scale 1..5)
--   $since_ns        bigint  = 0       only traces that started at or after this time (ns since epoch)
--   $trace_id        varchar = ''      only this trace ('' = every trace)
--   $strategy        varchar = greedy  one of greedy|full_path_min|weighted
--   $per             varchar = trace   one of trace|step: one row per failed trace, or per failed step
--   $max_hops        integer = 1000    bound on the recursions
--
-- Scores, recovered retries and the failure DAG (u -> v: v is the nearest failure downstream of the
-- non-recovered failure u) are defined in propagation.sql. For a failed step v:
--   greedy         start at v; repeatedly move to the lowest-scoring step among the failure-DAG
--                  predecessors of the current step (ties: earliest start, then span_id) until the
--                  current step has none. hops = moves made.
--   full_path_min  the lowest-scoring step among all failures upstream of v in the failure DAG
--                  (ties: earliest start, then span_id); v itself when none. hops = longest
--                  failure-DAG path from the root to v.
--   weighted       among the originating failures upstream of v (no failing upstream of their own),
--                  the one with the largest weight (5 - score) * (1 + number of failures downstream
--                  of it in the failure DAG): severity times blast radius (ties: earliest start,
--                  then span_id); v itself when v is originating. hops as for full_path_min.
-- The failure of a trace is its final failure: the non-recovered failure with no failure downstream
-- of it that has the most failures upstream (ties: latest end, then span_id). A trace whose
-- failures were all recovered is not a failed trace.
-- Recursion bounds: the downstream walk (reach) is a UNION over a finite set of (failure, step)
-- pairs, so it ends even on a cyclic edge set; the failure-DAG closure and the greedy walk stop
-- after $max_hops hops.
with recursive
win as (
    select trace_id, conversation_id from trace_window($since_ns, $trace_id)
),
g as materialized (
    from failure_roots($fail_threshold, (select list(trace_id) from win), $max_hops)
),
fail as (
    select * exclude (nearest, ancestors, greedy_root_id, greedy_hops, final) from g
),
fe as (
    -- the failure DAG: an edge up -> down
    select trace_id, unnest(nearest) as up, span_id as down from g
),
anc as (
    -- its closure: a fails upstream of v, dist = hops of the longest path from a to v
    select trace_id, span_id as v, unnest(ancestors, recursive := true) from g
),
greedy as (
    select trace_id, span_id, greedy_root_id as root_id, greedy_hops as hops from g
),
full_path_min as (
    select anc.trace_id, anc.v as span_id, anc.a as root_id, anc.dist as hops
    from anc join fail a on a.trace_id = anc.trace_id and a.span_id = anc.a
    qualify row_number() over (
        partition by anc.trace_id, anc.v order by a.score, a.start_time_unix_nano, anc.a) = 1
),
blast as (
    select trace_id, a as span_id, count(*) as downstream_failures
    from anc group by all
),
weighted as (
    select anc.trace_id, anc.v as span_id, anc.a as root_id, anc.dist as hops
    from anc
    join fail a on a.trace_id = anc.trace_id and a.span_id = anc.a
    join blast b on b.trace_id = anc.trace_id and b.span_id = anc.a
    where not exists (select 1 from fe where fe.trace_id = anc.trace_id and fe.down = anc.a)
    qualify row_number() over (
        partition by anc.trace_id, anc.v
        order by (5.0 - a.score) * (1 + b.downstream_failures) desc, a.start_time_unix_nano, anc.a) = 1
),
chosen as (
    select * from greedy where cast($strategy as varchar) = 'greedy'
    union all
    select * from full_path_min where cast($strategy as varchar) = 'full_path_min'
    union all
    select * from weighted where cast($strategy as varchar) = 'weighted'
),
upstream_count as (
    select trace_id, v as span_id, count(*) as n from anc group by all
),
final as (
    select trace_id, span_id from g where final
),
per_trace as (
    select trace_id, count(*) as failed_steps from fail group by all
)
select f.trace_id, cast($strategy as varchar) as strategy,
       f.span_id as failed_span_id, f.step_type as failed_step_type, f.step_name as failed_step_name,
       f.score as failed_score, f.recovered,
       case when c.span_id is null then 'originating' else 'propagated' end as kind,
       r.span_id as root_span_id, r.step_type as root_step_type, r.step_name as root_step_name,
       r.score as root_score, r.taxonomy_l1 as root_taxonomy_l1, r.taxonomy_l2 as root_taxonomy_l2,
       r.taxonomy_l3 as root_taxonomy_l3, coalesce(ch.hops, 0) as hops,
       p.failed_steps as failed_steps_in_trace, w.conversation_id,
       make_timestamp(f.start_time_unix_nano // 1000) as start_time
from fail f
join win w on w.trace_id = f.trace_id
join per_trace p on p.trace_id = f.trace_id
left join upstream_count c on c.trace_id = f.trace_id and c.span_id = f.span_id
left join chosen ch on ch.trace_id = f.trace_id and ch.span_id = f.span_id
join fail r on r.trace_id = f.trace_id and r.span_id = coalesce(ch.root_id, f.span_id)
where (case when cast($strategy as varchar) in ('greedy', 'full_path_min', 'weighted')
             and cast($per as varchar) in ('trace', 'step') then true
            else error('strategy must be greedy|full_path_min|weighted and per trace|step') end)
  and (cast($per as varchar) = 'step'
       or exists (select 1 from final x where x.trace_id = f.trace_id and x.span_id = f.span_id))
order by f.trace_id, f.start_time_unix_nano, f.span_id
