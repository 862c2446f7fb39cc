-- step_stats: per step type and name, runs, failure rate, p50/p90 latency, tokens and cost; plus conversation-turn latency.
--
-- Inputs:  traces, dag_nodes, step_scores, spans (model, input_tokens, output_tokens)
-- Output:  grain ('step' | 'turn'), step_type, step_name, runs, failures, failure_rate, p50_ms,
--          p90_ms, input_tokens, output_tokens, cost_usd
-- Params:
--   $fail_threshold           double  = 2.0  a step fails when its score (the minimum over its step_scores rows) is <= this
--   $since_ns                 bigint  = 0    only traces that started at or after this time (ns)
--   $trace_id                 varchar = ''   only this trace ('' = every trace)
--   $default_input_per_mtok   double  = 0.0  USD per 1M input tokens for a model not in the price list
--   $default_output_per_mtok  double  = 0.0  USD per 1M output tokens for a model not in the price list
--
-- 'step' rows: one per (step_type, step_name) over the step instances of dag_nodes; a run fails
-- when its score (the minimum over its step_scores rows; human labels override) is <= $fail_threshold,
-- recovered retries included. Latency percentiles interpolate linearly (quantile_cont).
-- 'turn' row: one conversation turn = one trace (all the steps that answer one user message);
-- runs = traces, failures = traces with a failure no retry recovered, latency = trace duration,
-- tokens and cost summed over the trace's spans.
-- cost_usd = input_tokens * input price + output_tokens * output price, the price of a span's
-- model taken from the price list of _costs.sql (macros model_prices and span_costs; USD per 1M
-- tokens, public list prices of late 2024/2025); the longest name in the list contained in the
-- lower-cased model name wins.
with
win as (
    select trace_id, duration_ns
    from traces
    where coalesce(start_time_unix_nano, 0) >= cast($since_ns as bigint)
      and (cast($trace_id as varchar) = '' or trace_id = cast($trace_id as varchar))
),
candidate as (
    -- only a step with a score row <= threshold can fail
    select distinct trace_id, span_id
    from step_scores
    where cast(score as double) <= cast($fail_threshold as double) and trace_id in (select trace_id from win)
),
step_score as (
    -- the lowest human score if there is one, else the lowest score (candidate steps only)
    select s.trace_id, s.span_id,
           coalesce(min(cast(s.score as double)) filter (where s.source = 'human'), min(cast(s.score as double)))
               as score
    from step_scores s
    semi join candidate c on c.trace_id = s.trace_id and c.span_id = s.span_id
    where s.score is not null
    group by s.trace_id, s.span_id
),
span_cost as (
    select trace_id, span_id, input_tokens, output_tokens, cost_usd
    from span_costs((select list(trace_id) from win), $default_input_per_mtok, $default_output_per_mtok)
),
node as (
    select n.trace_id, n.span_id, cast(n.step_type as varchar) as step_type, n.step_name,
           coalesce(n.step_key, n.step_name, n.span_id) as step_key, coalesce(n.iteration, 1) as iteration,
           n.duration_ns / 1e6 as duration_ms,
           coalesce(s.score <= cast($fail_threshold as double), false) as failed,
           coalesce(c.input_tokens, 0) as input_tokens, coalesce(c.output_tokens, 0) as output_tokens,
           coalesce(c.cost_usd, 0) as cost_usd
    from dag_nodes n
    left join step_score s on s.trace_id = n.trace_id and s.span_id = n.span_id
    left join span_cost c on c.trace_id = n.trace_id and c.span_id = n.span_id
    where n.trace_id in (select trace_id from win)
),
unrecovered as (
    select distinct f.trace_id
    from node f
    where f.failed
      and not exists (select 1 from node later
                      where later.trace_id = f.trace_id and later.step_key = f.step_key
                        and later.iteration > f.iteration and not later.failed)
),
turn as (
    select w.trace_id, w.duration_ns / 1e6 as duration_ms,
           u.trace_id is not null as failed,
           coalesce(sum(n.input_tokens), 0) as input_tokens, coalesce(sum(n.output_tokens), 0) as output_tokens,
           coalesce(sum(n.cost_usd), 0) as cost_usd
    from win w
    left join node n on n.trace_id = w.trace_id
    left join unrecovered u on u.trace_id = w.trace_id
    group by w.trace_id, w.duration_ns, u.trace_id
)
select 'step' as grain, step_type, step_name, count(*) as runs,
       count(*) filter (where failed) as failures,
       cast(count(*) filter (where failed) as double) / count(*) as failure_rate,
       quantile_cont(duration_ms, 0.5) as p50_ms, quantile_cont(duration_ms, 0.9) as p90_ms,
       sum(input_tokens) as input_tokens, sum(output_tokens) as output_tokens, sum(cost_usd) as cost_usd
from node
group by step_type, step_name
union all
select 'turn', null, 'conversation turn', count(*), count(*) filter (where failed),
       cast(count(*) filter (where failed) as double) / nullif(count(*), 0),
       quantile_cont(duration_ms, 0.5), quantile_cont(duration_ms, 0.9),
       sum(input_tokens), sum(output_tokens), sum(cost_usd)
from turn
having count(*) > 0
order by grain, runs desc, step_type, step_name
