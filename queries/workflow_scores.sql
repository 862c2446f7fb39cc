-- workflow_scores: per trace, the weighted harmonic mean of its step scores (weights grow with descendants) and pass/fail.
--
-- Inputs:  traces, dag_nodes (nested_left/right: call-tree descendants), step_scores
-- Output:  trace_id, conversation_id, method, steps, scored_steps, failed_steps, min_score,
--          workflow_score, passed, start_time, start_time_unix_nano
-- Params:
--   $fail_threshold  double  = 2.0  a step fails when its aggregated score is <= this (scale 1..5)
--   $pass_threshold  double  = 3.0  a trace passes when its workflow score is >= this
--   $unscored_score  double  = 5.0  score given to a step without any score row; a negative value
--                                   leaves unscored steps out of the mean instead
--   $since_ns        bigint  = 0    only traces that started at or after this time (ns since epoch)
--   $trace_id        varchar = ''   only this trace ('' = every trace)
--
-- Step score as in failures.sql (minimum over metrics, human labels override other sources).
-- weight(step) = 1 + number of its descendants in the call tree, read from the nested-set bounds
-- of dag_nodes ((nested_right - nested_left - 1) / 2: one counter per trace, bumped on entering and
-- leaving a node), so the root that answers the user weighs most; a flat-fallback trace (no nested
-- set) weighs every step 1.
-- workflow_score = sum(weight) / sum(weight / score) over the counted steps (scores below 1 are
-- clamped to 1); null, and passed null, when the trace has no scored step. Recovered failures count
-- (the retry cost something); failed_steps counts them too.
with
win as (
    select trace_id, conversation_id, method, start_time_unix_nano
    from traces
    where coalesce(start_time_unix_nano, 0) >= cast($since_ns as bigint)
      and (cast($trace_id as varchar) = '' or trace_id = cast($trace_id as varchar))
),
step_score as (
    -- one row per step: the lowest human score if there is one, else the lowest score
    select trace_id, span_id,
           coalesce(min(cast(score as double)) filter (where source = 'human'), min(cast(score as double)))
               as score
    from step_scores
    where score is not null and trace_id in (select trace_id from win)
    group by trace_id, span_id
),
counted as (
    select n.trace_id, n.span_id, s.score,
           1 + coalesce(greatest((n.nested_right - n.nested_left - 1) // 2, 0), 0) as weight,
           case when s.score is not null then greatest(s.score, 1.0)
                when cast($unscored_score as double) >= 0 then greatest(cast($unscored_score as double), 1.0)
           end as used_score
    from dag_nodes n
    left join step_score s on s.trace_id = n.trace_id and s.span_id = n.span_id
    where n.trace_id in (select trace_id from win)
),
per_trace as (
    select trace_id, count(*) as steps, count(score) as scored_steps,
           count(*) filter (where score <= cast($fail_threshold as double)) as failed_steps,
           min(score) as min_score,
           case when count(score) > 0
                then sum(weight) filter (where used_score is not null)
                     / sum(weight / used_score) filter (where used_score is not null)
           end as workflow_score
    from counted
    group by trace_id
)
select w.trace_id, w.conversation_id, w.method, coalesce(p.steps, 0) as steps,
       coalesce(p.scored_steps, 0) as scored_steps, coalesce(p.failed_steps, 0) as failed_steps,
       p.min_score, p.workflow_score,
       p.workflow_score >= cast($pass_threshold as double) as passed,
       make_timestamp(w.start_time_unix_nano // 1000) as start_time, w.start_time_unix_nano
from win w
left join per_trace p on p.trace_id = w.trace_id
order by w.start_time_unix_nano, w.trace_id
