-- failures: failed steps (aggregated score <= $fail_threshold) with score, category, trace, conversation and time.
--
-- Inputs:  traces, dag_nodes, step_scores (views of tracedag.pipeline.views.connect)
-- Output:  trace_id, span_id, step_type, step_name, step_key, iteration, score, metric, source,
--          taxonomy_l1, taxonomy_l2, taxonomy_l3, explanation, recovered, conversation_id,
--          service_name, start_time, start_time_unix_nano, duration_ms
-- Params:
--   $fail_threshold  double  = 2.0  a step fails when its aggregated score is <= this (scale 1..5)
--   $since_ns        bigint  = 0    only traces that started at or after this time (ns since epoch)
--   $trace_id        varchar = ''   only this trace ('' = every trace)
--
-- A step's score: the minimum over its step_scores rows (one per metric/source); when a human label
-- exists for the step, only the human rows count. The category (taxonomy) and metric are those of
-- the lowest-scoring row (ties: a row with a taxonomy first, then by metric, source).
-- recovered: a later iteration of the same step_key in the same trace did not fail (a retry fixed
-- it); such a failure never propagates (see propagation.sql).
with
win as (
    select trace_id, conversation_id, service_name
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
                        'taxonomy_l3': taxonomy_l3, 'explanation': explanation},
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
    select n.*, s.score, s.metric, s.source, s.taxonomy_l1, s.taxonomy_l2, s.taxonomy_l3, s.explanation
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
)
select f.trace_id, f.span_id, f.step_type, f.step_name, f.step_key, f.iteration, f.score, f.metric,
       f.source, f.taxonomy_l1, f.taxonomy_l2, f.taxonomy_l3, f.explanation, f.recovered,
       w.conversation_id, w.service_name,
       make_timestamp(f.start_time_unix_nano // 1000) as start_time, f.start_time_unix_nano,
       f.duration_ns / 1e6 as duration_ms
from fail f
join win w on w.trace_id = f.trace_id
order by f.start_time_unix_nano, f.trace_id, f.span_id
