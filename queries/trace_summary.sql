-- trace_summary: one row per trace for dashboards: shape, failures, workflow score, pass/fail and greedy root cause.
--
-- Inputs:  traces, dag_nodes, dag_edges, step_scores, spans, read through the macros trace_window,
--          failure_roots and workflow_weights of _failure_graph.sql
-- Output:  trace_id, service_name, service_version, conversation_id, run_id, scenario_id, variant_id,
--          start_time, start_time_unix_nano, duration_ms, span_count, error_count, method,
--          connected, deviant, fallback_reason, steps, scored_steps, failed_steps,
--          unrecovered_failures, originating_failures, min_score, workflow_score, passed,
--          root_cause_span_id, root_cause_step, root_cause_type, root_cause_score, root_cause_category
-- columns: trace_id, service_name, start_time, duration_ms, failed_steps, workflow_score, passed, root_cause_step, root_cause_category
-- Params:
--   $fail_threshold  double  = 2.0   a step fails when its score (the minimum over its step_scores rows) is <= this (scale 1..5)
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
with
win as (
    select * from trace_window($since_ns, $trace_id)
),
g as materialized (
    from failure_roots($fail_threshold, (select list(trace_id) from win), $max_hops)
),
weights as (
    -- a recovered failure weighs 1, as in workflow_scores.sql
    select w.trace_id, w.span_id, w.score, case when r.span_id is null then w.weight else 1 end as weight,
           w.used_score
    from workflow_weights((select list(trace_id) from win), $unscored_score) w
    left join g r on r.trace_id = w.trace_id and r.span_id = w.span_id and r.recovered
),
wscore as (
    select trace_id, count(*) as steps, count(score) as scored_steps, min(score) as min_score,
           case when count(score) > 0
                then sum(weight) filter (where used_score is not null)
                     / sum(cast(weight / used_score as decimal(38, 18))) filter (where used_score is not null)
           end as workflow_score
    from weights group by trace_id
),
fcount as (
    select trace_id, count(*) as failed_steps,
           count(*) filter (where not recovered) as unrecovered_failures,
           -- originating: no failure-DAG edge into it
           count(*) filter (where not recovered and len(nearest) = 0) as originating_failures
    from g group by trace_id
),
root as (
    select x.trace_id, r.span_id, r.step_name, r.step_type, r.score, coalesce(r.taxonomy_l1, 'unclassified') as category
    from g x
    join g r on r.trace_id = x.trace_id and r.span_id = x.greedy_root_id
    where x.final
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
