-- root_causes: root-cause step of each failed trace (or of each failed step) by a chosen strategy.
--
-- Inputs:  traces, dag_nodes, dag_edges (upstream_span_id -> downstream_span_id), step_scores
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
    select trace_id, conversation_id
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
gnext as (
    select fe.trace_id, fe.down as v, fe.up as nxt
    from fe join fail u on u.trace_id = fe.trace_id and u.span_id = fe.up
    qualify row_number() over (
        partition by fe.trace_id, fe.down order by u.score, u.start_time_unix_nano, fe.up) = 1
),
walk(trace_id, start_id, cur, hops) as (
    select trace_id, span_id, span_id, 0 from fail
    union all
    select w.trace_id, w.start_id, g.nxt, w.hops + 1
    from walk w join gnext g on g.trace_id = w.trace_id and g.v = w.cur
    where w.hops < cast($max_hops as integer)
),
greedy as (
    select trace_id, start_id as span_id, cur as root_id, hops
    from walk
    qualify row_number() over (partition by trace_id, start_id order by hops desc) = 1
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
    select f.trace_id, f.span_id
    from fail f
    left join upstream_count c on c.trace_id = f.trace_id and c.span_id = f.span_id
    where not f.recovered
      and not exists (select 1 from fe where fe.trace_id = f.trace_id and fe.up = f.span_id)
    qualify row_number() over (
        partition by f.trace_id
        order by coalesce(c.n, 0) desc, f.end_time_unix_nano desc nulls last, f.span_id) = 1
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
