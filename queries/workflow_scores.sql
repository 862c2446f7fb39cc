-- workflow_scores: per trace, the weighted harmonic mean of its step scores (weights grow with descendants) and pass/fail.
--
-- Inputs:  traces, dag_nodes (nested_left/right: call-tree descendants), step_scores, read
--          through the macros trace_window and workflow_weights of _failure_graph.sql
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
    select trace_id, conversation_id, method, start_time_unix_nano from trace_window($since_ns, $trace_id)
),
counted as (
    from workflow_weights((select list(trace_id) from win), $unscored_score)
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
