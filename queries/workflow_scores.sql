-- workflow_scores: per trace, the weighted harmonic mean of its step scores (weight 1 + the steps that depend on it) and pass/fail.
--
-- Inputs:  traces, dag_nodes (depth, nested_left/right), dag_edges, step_scores, spans, read
--          through the macros trace_window, failure_steps and workflow_weights of _failure_graph.sql
-- Output:  trace_id, conversation_id, method, steps, scored_steps, failed_steps, min_score,
--          workflow_score, passed, start_time, start_time_unix_nano
-- Params:
--   $fail_threshold  double  = 2.0  a step fails when its score (the minimum over its step_scores rows) is <= this (scale 1..5)
--   $pass_threshold  double  = 3.0  a trace passes when its workflow score is >= this
--   $unscored_score  double  = 5.0  score given to a step without any score row; a negative value
--                                   leaves unscored steps out of the mean instead
--   $since_ns        bigint  = 0    only traces that started at or after this time (ns since epoch)
--   $trace_id        varchar = ''   only this trace ('' = every trace)
--
-- Step score as in failures.sql (the minimum over its step_scores rows; human labels override other sources).
-- weight(step) = 1 + desc(step), AgentEval's number of steps that depend on it: along the
-- dependency direction (a child feeds its parent, an earlier sibling a later one) these are its
-- call-tree ancestors plus, for the step and each ancestor, the siblings that start at or after it
-- ends (the sibling order the DAG builder uses; explicit edges are not followed). So the first
-- steps, whose errors reach the most others, weigh most and the root that only collects them
-- weighs 1; a flat-fallback trace (no nested set, no edges) weighs every step 1. (Before issue 18
-- the weight was 1 + call-tree descendants: the inverse direction.)
-- workflow_score = sum(weight) / sum(weight / score) over the counted steps (scores below 1 are
-- clamped to 1); null, and passed null, when the trace has no scored step. Recovered failures (a
-- retry or another route fixed them, see propagation.sql) count with weight 1, since nothing
-- downstream used their result: the retry cost something, but a recovered trace can pass;
-- failed_steps counts them too.
-- The terms w / score are summed as decimals (18 places): a sum of doubles depends on the order the
-- parallel aggregate adds them in, and a mean of exactly 3 came out 2.9999999999999996 (failing) in one
-- run and 3.0 in the next.
with
win as (
    select trace_id, conversation_id, method, start_time_unix_nano from trace_window($since_ns, $trace_id)
),
recovered as (
    select trace_id, span_id from failure_steps($fail_threshold, (select list(trace_id) from win)) where recovered
),
counted as (
    -- a recovered failure weighs 1: nothing downstream used its result (the retry or route replaced it)
    select w.trace_id, w.span_id, w.score, case when r.span_id is null then w.weight else 1 end as weight,
           w.used_score
    from workflow_weights((select list(trace_id) from win), $unscored_score) w
    left join recovered r on r.trace_id = w.trace_id and r.span_id = w.span_id
),
per_trace as (
    select trace_id, count(*) as steps, count(score) as scored_steps,
           count(*) filter (where score <= cast($fail_threshold as double)) as failed_steps,
           min(score) as min_score,
           case when count(score) > 0
                then sum(weight) filter (where used_score is not null)
                     / sum(cast(weight / used_score as decimal(38, 18))) filter (where used_score is not null)
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
