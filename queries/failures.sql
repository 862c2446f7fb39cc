-- failures: failed steps (score, the minimum over the step's step_scores rows, <= $fail_threshold) with score, category, trace, conversation and time.
--
-- Inputs:  traces, dag_nodes, step_scores, spans (views of tracedag.pipeline.views.connect), read through
--          the macros trace_window and failure_steps of _failure_graph.sql
-- Output:  trace_id, span_id, step_type, step_name, step_key, iteration, score, metric, source,
--          taxonomy_l1, taxonomy_l2, taxonomy_l3, explanation, recovered, conversation_id,
--          service_name, start_time, start_time_unix_nano, duration_ms, recovered_by, recovery, cancelled
-- columns: step_name, step_type, score, taxonomy_l1, recovered, explanation, trace_id
-- Params:
--   $fail_threshold  double  = 2.0  a step fails when its score (the minimum over its step_scores rows) is <= this (scale 1..5)
--   $since_ns        bigint  = 0    only traces that started at or after this time (ns since epoch)
--   $trace_id        varchar = ''   only this trace ('' = every trace)
--
-- A step's score: the minimum over its step_scores rows (one per metric/source); when a human label
-- exists for the step, only the human rows count. The category (taxonomy) and metric are those of
-- the lowest-scoring row (ties: a row with a taxonomy first, then by metric, source).
-- recovered: a retry (a later iteration of the same step_key did not fail) or another route (a
-- later step serving the same purpose did not fail, and the answer did not fail) fixed it;
-- recovered_by names that step, recovery says which ('retry' | 'route'); cancelled: the step was
-- cancelled (CancelledError, ...). Neither
-- kind ever propagates; the exact rules are in propagation.sql.
with
win as (
    select trace_id, conversation_id, service_name from trace_window($since_ns, $trace_id)
),
fail as (
    from failure_steps($fail_threshold, (select list(trace_id) from win))
)
select f.trace_id, f.span_id, f.step_type, f.step_name, f.step_key, f.iteration, f.score, f.metric,
       f.source, f.taxonomy_l1, f.taxonomy_l2, f.taxonomy_l3, f.explanation, f.recovered,
       w.conversation_id, w.service_name,
       make_timestamp(f.start_time_unix_nano // 1000) as start_time, f.start_time_unix_nano,
       f.duration_ns / 1e6 as duration_ms, f.recovered_by, f.recovery, f.cancelled
from fail f
join win w on w.trace_id = f.trace_id
order by f.start_time_unix_nano, f.trace_id, f.span_id
