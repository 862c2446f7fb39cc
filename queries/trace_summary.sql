-- trace_summary: one row per trace for dashboards: shape, failures, workflow score, pass/fail and greedy root cause.
--
-- Inputs:  traces, dag_nodes, dag_edges, step_scores
-- Output:  trace_id, service_name, service_version, conversation_id, run_id, scenario_id, variant_id,
--          start_time, start_time_unix_nano, duration_ms, span_count, error_count, method,
--          connected, deviant, fallback_reason, steps, scored_steps, failed_steps,
--          unrecovered_failures, originating_failures, min_score, workflow_score, passed,
--          root_cause_span_id, root_cause_step, root_cause_type, root_cause_score, root_cause_category
-- Params:
--   $fail_threshold  double  = 2.0   a step fails when its aggregated score is <= this (scale 1..5)
--   $pass_threshold  double  = 3.0   a trace passes when its workflow score is >= this
--   $unscored_score  double  = 5.0   score of a step without score rows (negative: leave it out)
--   $since_ns        bigint  = 0     only traces that started at or after this time (ns since epoch)
--   $trace_id        varchar = ''    only this trace ('' = every trace)
--   $max_hops        integer = 1000  bound on the recursions
--
-- Every definition is the one of the dedicated query: step score and recovered retries as in
-- failures.sql, originating failures as in propagation.sql, workflow_score/passed as in
-- workflow_scores.sql, root cause = the greedy root of the trace's final failure as in
-- root_causes.sql (strategy greedy, per trace); category = its taxonomy_l1 ('unclassified' if none).
-- Recursion bounds: the downstream walk (reach) is a UNION over a finite set of (failure, step)
-- pairs, so it ends even on a cyclic edge set; the failure-DAG closure and the greedy walk stop
-- after $max_hops hops.
with recursive
win as (
    select *
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
all_score as (
    -- the score of every step (lowest human score if any, else lowest score), for the workflow score
    select trace_id, span_id,
           coalesce(min(cast(score as double)) filter (where source = 'human'), min(cast(score as double)))
               as score
    from step_scores
    where score is not null and trace_id in (select trace_id from win)
    group by trace_id, span_id
),
weights as (
    select n.trace_id, n.span_id, s.score,
           1 + coalesce(greatest((n.nested_right - n.nested_left - 1) // 2, 0), 0) as weight,
           case when s.score is not null then greatest(s.score, 1.0)
                when cast($unscored_score as double) >= 0 then greatest(cast($unscored_score as double), 1.0)
           end as used_score
    from dag_nodes n
    left join all_score s on s.trace_id = n.trace_id and s.span_id = n.span_id
    where n.trace_id in (select trace_id from win)
),
wscore as (
    select trace_id, count(*) as steps, count(score) as scored_steps, min(score) as min_score,
           case when count(score) > 0
                then sum(weight) filter (where used_score is not null)
                     / sum(weight / used_score) filter (where used_score is not null)
           end as workflow_score
    from weights group by trace_id
),
fcount as (
    select trace_id, count(*) as failed_steps,
           count(*) filter (where not recovered) as unrecovered_failures,
           count(*) filter (where not recovered and not exists (
               select 1 from fe where fe.trace_id = fail.trace_id and fe.down = fail.span_id))
               as originating_failures
    from fail group by trace_id
),
root as (
    select x.trace_id, r.span_id, r.step_name, r.step_type, r.score, coalesce(r.taxonomy_l1, 'unclassified') as category
    from final x
    join greedy g on g.trace_id = x.trace_id and g.span_id = x.span_id
    join fail r on r.trace_id = g.trace_id and r.span_id = g.root_id
)
select w.trace_id, w.service_name, w.service_version, w.conversation_id, w.run_id, w.scenario_id,
       w.variant_id, make_timestamp(w.start_time_unix_nano // 1000) as start_time, w.start_time_unix_nano,
       w.duration_ns / 1e6 as duration_ms, w.span_count, w.error_count, w.method, w.connected, w.deviant,
       w.fallback_reason, coalesce(s.steps, 0) as steps, coalesce(s.scored_steps, 0) as scored_steps,
       coalesce(f.failed_steps, 0) as failed_steps, coalesce(f.unrecovered_failures, 0) as unrecovered_failures,
       coalesce(f.originating_failures, 0) as originating_failures, s.min_score, s.workflow_score,
       s.workflow_score >= cast($pass_threshold as double) as passed,
       r.span_id as root_cause_span_id, r.step_name as root_cause_step, r.step_type as root_cause_type,
       r.score as root_cause_score, r.category as root_cause_category
from win w
left join wscore s on s.trace_id = w.trace_id
left join fcount f on f.trace_id = w.trace_id
left join root r on r.trace_id = w.trace_id
order by w.start_time_unix_nano, w.trace_id
